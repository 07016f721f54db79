//! On / off knobs for A/B runs and tests.

/// A developer's on / off knob for A/B runs: an environment variable (on unless it is `0`; for
/// an opt-in one, [`Switch::opt_in`], off unless it is `1`) that tests and benchmarks may
/// override for the whole process.
pub(crate) struct Switch {
    var: &'static str,
    /// Whether it is on when the variable is unset.
    default_on: bool,
    env: std::sync::OnceLock<bool>,
    /// 0: the variable decides; 1: off; 2: on.
    over: std::sync::atomic::AtomicU32,
}

impl Switch {
    pub(crate) const fn new(var: &'static str) -> Self {
        Self {
            var,
            default_on: true,
            env: std::sync::OnceLock::new(),
            over: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// A knob that is off unless its variable is `1` (not yet measured on a card).
    pub(crate) const fn opt_in(var: &'static str) -> Self {
        Self {
            var,
            default_on: false,
            env: std::sync::OnceLock::new(),
            over: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub(crate) fn on(&self) -> bool {
        match self.over.load(std::sync::atomic::Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => *self.env.get_or_init(|| match std::env::var(self.var) {
                Ok(v) if self.default_on => v.trim() != "0",
                Ok(v) => v.trim() == "1",
                Err(_) => self.default_on,
            }),
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
        static OPT_IN: Switch = Switch::opt_in("REDLINE_TEST_SWITCH_NEVER_SET");
        assert!(!OPT_IN.on());
        OPT_IN.set(Some(true));
        assert!(OPT_IN.on());
    }
}
