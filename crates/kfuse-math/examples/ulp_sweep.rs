//! Measures every f32 function of kfuse-math against its f64 reference over the float range and
//! prints a Markdown table (the one in `docs/numerics.md`).
//!
//! `cargo run --release -p kfuse-math --example ulp_sweep` checks every f32 bit pattern
//! (about a minute per function on two cores); `-- STEP` checks every STEP-th pattern, and
//! `-- STEP NAME...` only the named functions.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let step: u64 = args
        .first()
        .map_or(1, |s| s.parse().expect("STEP must be an integer"));
    let only = &args[args.len().min(1)..];
    println!("| function | max error (ULP) | at x | bound |");
    println!("|---|---|---|---|");
    for f in kfuse_math::accuracy::functions() {
        if !only.is_empty() && !only.iter().any(|n| n == f.name) {
            continue;
        }
        let (err, x) = kfuse_math::accuracy::max_ulp_error(&f, step, 0);
        println!("| {} | {err:.3} | {x:e} | {} |", f.name, f.bound_ulp);
    }
}
