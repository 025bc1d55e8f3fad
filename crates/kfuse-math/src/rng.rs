//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
//! counter-based generator behind the `rng` op. Element `i` of an `rng` node with seed `s` uses
//! counter `[i_lo, i_hi, 0, 0]` and key `[s_lo, s_hi]`, so every element is a pure function of the
//! seed and its row-major index.

const M0: u64 = 0xD251_1F53;
const M1: u64 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Ten Philox rounds of `counter` under `key`.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

fn block(seed: u64, index: u64) -> [u32; 4] {
    philox4x32(
        [index as u32, (index >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

const TWO_M24: f32 = 1.0 / 16_777_216.0;
const TWO_M53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// Uniform on `[0, 1)` with 24 random bits.
pub fn uniform_f32(seed: u64, index: u64) -> f32 {
    (block(seed, index)[0] >> 8) as f32 * TWO_M24
}

/// Uniform on `[0, 1)` with 53 random bits.
pub fn uniform_f64(seed: u64, index: u64) -> f64 {
    let w = block(seed, index);
    ((((w[0] as u64) << 32) | w[1] as u64) >> 11) as f64 * TWO_M53
}

/// Standard normal by Box-Muller on two 24-bit uniforms, with kfuse's own `log` and `cos`.
pub fn normal_f32(seed: u64, index: u64) -> f32 {
    let w = block(seed, index);
    let u1 = ((w[0] >> 8) + 1) as f32 * TWO_M24; // (0, 1]
    let u2 = (w[1] >> 8) as f32 * TWO_M24;
    (-2.0 * crate::log_f32(u1)).sqrt() * crate::cos_f32(std::f32::consts::TAU * u2)
}

/// Standard normal by Box-Muller on two 53-bit uniforms.
pub fn normal_f64(seed: u64, index: u64) -> f64 {
    let w = block(seed, index);
    let u1 = (((((w[0] as u64) << 32) | w[1] as u64) >> 11) + 1) as f64 * TWO_M53;
    let u2 = ((((w[2] as u64) << 32) | w[3] as u64) >> 11) as f64 * TWO_M53;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
