//! `quant::dot::dot_f32` (the SIMD f32 dot used for attention scores) against an f64 sum,
//! on every length 0..=300 (SIMD bodies and scalar tails).

mod dot_common;

use dot_common::Rng;

#[test]
fn dot_f32_matches_f64_sum_at_every_length() {
    let mut rng = Rng::new(5);
    for n in 0..=300 {
        let a: Vec<f32> = rng.activations(n);
        let b: Vec<f32> = rng.activations(n);
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        let mag: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| (x as f64 * y as f64).abs())
            .sum();
        let got = quant::dot::dot_f32(&a, &b) as f64;
        assert!(
            (got - want).abs() <= 1e-6 * mag + 1e-9,
            "n={n}: {got} vs {want}"
        );
    }
}

#[test]
#[should_panic(expected = "unequal lengths")]
fn dot_f32_refuses_unequal_lengths() {
    quant::dot::dot_f32(&[1.0, 2.0], &[1.0]);
}
