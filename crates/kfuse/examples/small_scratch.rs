#[global_allocator]
static ALLOC: kfuse::CacheAligned = kfuse::CacheAligned;
use kfuse::{Array, CustomOps, FixedCostModel};
use std::time::Instant;
fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (n, c, e, hw) = (env("N", 1), env("C", 160), env("E", 960), env("HW", 7));
    let input =
        |name: &str, dims: &[usize]| format!("%{name} = input() name=\"{name}\" : f32{dims:?}\n");
    let conv = |x: &str, w: &str, out: &str, groups: usize, pad: usize| {
        format!("%{out} = conv2d(%{x}, %{w}) layout=nchw stride=[1, 1] padding=[{pad}, {pad}, {pad}, {pad}] dilation=[1, 1] groups={groups}\n")
    };
    let relu6 = |v: &str, out: &str| format!("%{out} = clamp(%{v}, %lo, %hi)\n");
    let block = input("x", &[n, c, hw, hw])
        + &input("we", &[e, c, 1, 1])
        + &input("be", &[e, 1, 1])
        + &input("wd", &[e, 1, 3, 3])
        + &input("bd", &[e, 1, 1])
        + &input("wp", &[c, e, 1, 1])
        + &input("bp", &[c, 1, 1])
        + "%lo = constant() value=[0.0] : f32[]\n%hi = constant() value=[6.0] : f32[]\n"
        + &conv("x", "we", "x1", 1, 0)
        + "%x2 = add(%x1, %be)\n"
        + &relu6("x2", "x3")
        + &conv("x3", "wd", "d1", e, 1)
        + "%d2 = add(%d1, %bd)\n"
        + &relu6("d2", "d3")
        + &conv("d3", "wp", "p1", 1, 0)
        + "%p2 = add(%p1, %bp)\n%y = add(%p2, %x)\noutput \"y\" = %y\n";
    let cx = kfuse::Context::new();
    cx.set_seed(11);
    let randn = |dims: &[usize], s: f64| -> Array {
        (cx.randn(kfuse::DType::F32, dims) * s).to_array().unwrap()
    };
    let frozen = vec![
        ("we".to_string(), randn(&[e, c, 1, 1], 0.2)),
        ("be".to_string(), randn(&[e, 1, 1], 0.1)),
        ("wd".to_string(), randn(&[e, 1, 3, 3], 0.3)),
        ("bd".to_string(), randn(&[e, 1, 1], 0.1)),
        ("wp".to_string(), randn(&[c, e, 1, 1], 0.1)),
        ("bp".to_string(), randn(&[c, 1, 1], 0.1)),
    ];
    let graph = kfuse::opt::freeze(&kfuse::parse(&block).unwrap(), &frozen).unwrap();
    let inputs = vec![("x".to_string(), randn(&[n, c, hw, hw], 1.0))];
    for policy in [kfuse::FusePolicy::Cost, kfuse::FusePolicy::None] {
        let options = kfuse::Options {
            policy,
            cache_dir: std::path::PathBuf::from("/tmp/kfuse_cache_scratch"),
            ..kfuse::Options::default()
        };
        let exe = kfuse::compile(&graph, &options, &FixedCostModel::default()).unwrap();
        let mut runner = exe.runner();
        let reps = 400;
        let mut t = vec![];
        for _ in 0..reps {
            let s = Instant::now();
            runner.run(&inputs, &CustomOps::new()).unwrap();
            t.push(s.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(f64::total_cmp);
        println!(
            "{n}x{c}x{hw}x{hw} expand {e} {policy:?}: median {:.1} us",
            t[reps / 2]
        );
    }
}
