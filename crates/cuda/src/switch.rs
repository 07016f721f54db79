//! On / off knobs for A/B runs and tests.

/// A developer's on / off knob for A/B runs: an environment variable (on unless it is `0`) that
/// tests and benchmarks may override for the whole process.
pub(crate) struct Switch {
    var: &'static str,
    env: std::sync::OnceLock<bool>,
    /// 0: the variable decides; 1: off; 2: on.
    over: std::sync::atomic::AtomicU32,
}

impl Switch {
    pub(crate) const fn new(var: &'static str) -> Self {
        Self {
            var,
            env: std::sync::OnceLock::new(),
            over: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub(crate) fn on(&self) -> bool {
        match self.over.load(std::sync::atomic::Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => *self
                .env
                .get_or_init(|| std::env::var(self.var).map_or(true, |v| v.trim() != "0")),
        }
    }

    /// Forces it on or off (`None`: back to the variable).
    pub(crate) fn set(&self, on: Option<bool>) {
        self.over.store(
            on.map_or(0, |on| if on { 2 } else { 1 }),
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Switch;

    #[test]
    fn a_switch_is_on_unless_its_variable_is_0_and_an_override_wins() {
        static UNSET: Switch = Switch::new("REDLINE_TEST_SWITCH_NEVER_SET");
        assert!(UNSET.on());
        UNSET.set(Some(false));
        assert!(!UNSET.on());
        UNSET.set(Some(true));
        assert!(UNSET.on());
        UNSET.set(None);
        assert!(UNSET.on());
    }
}
