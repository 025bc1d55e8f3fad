//! The convolution route table, pinned: for every convolution shape the structured tests, the
//! W5-W7 workloads and the ResNet and MobileNet networks use, the route `conv::decide` takes on a
//! stated machine and why each route before it declined. Moving a threshold shows here as a
//! reviewed diff; re-bless with `KFUSE_BLESS=1 cargo test -p kfuse-routines --test routes`.
//!
//! Each file's header names the machine (`# conv2d routes: avx512, 2 threads`); each line below
//! it is a convolution `N C H W -> CO kK [sS] [pP] [gG] [dD] [nhwc] [f64|f16|bf16]` (stride 1,
//! "same" padding `d * (k - 1) / 2`, one group, no dilation, NCHW and f32 unless stated), or a
//! `#` comment kept as it is.

use std::path::Path;

use kfuse_ir::{Conv2dAttrs, DType, Layout};
use kfuse_routines::conv::{decide, Isa};

/// The machine a file's header names.
fn isa_of(header: &str) -> Result<Isa, String> {
    let spec = header
        .strip_prefix("# conv2d routes: ")
        .ok_or_else(|| format!("bad header {header:?}"))?;
    let (set, threads) = spec
        .split_once(", ")
        .ok_or_else(|| format!("bad machine {spec:?}"))?;
    let avx512 = match set {
        "avx512" => true,
        "no avx512" => false,
        other => return Err(format!("unknown instruction set {other:?}")),
    };
    let threads = threads
        .strip_suffix(" threads")
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| format!("bad thread count {threads:?}"))?;
    Ok(Isa { avx512, threads })
}

/// One convolution line: its input, weight and output dims, attributes and dtype.
struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    y: Vec<usize>,
    attrs: Conv2dAttrs,
    dtype: DType,
}

fn parse_case(line: &str) -> Result<Case, String> {
    let bad = || format!("bad convolution {line:?}");
    let (input, rest) = line.split_once(" -> ").ok_or_else(bad)?;
    let dims: Vec<usize> = input
        .split_whitespace()
        .map(|d| d.parse().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [n, c, h, w] = dims[..] else {
        return Err(bad());
    };
    let mut words = rest.split_whitespace();
    let co: usize = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
    let (mut k, mut s, mut p, mut g, mut d) = (None, 1, None, 1, 1);
    let (mut layout, mut dtype) = (Layout::Nchw, DType::F32);
    for word in words {
        let number = |prefix: &str| word.strip_prefix(prefix).and_then(|v| v.parse().ok());
        match word {
            "nhwc" => layout = Layout::Nhwc,
            "f64" => dtype = DType::F64,
            "f16" => dtype = DType::F16,
            "bf16" => dtype = DType::BF16,
            _ if number("k").is_some() => k = number("k"),
            _ if number("s").is_some() => s = number("s").unwrap(),
            _ if number("p").is_some() => p = number("p"),
            _ if number("g").is_some() => g = number("g").unwrap(),
            _ if number("d").is_some() => d = number("d").unwrap(),
            _ => return Err(format!("{}: unknown word {word:?}", bad())),
        }
    }
    let k: usize = k.ok_or_else(bad)?;
    let p = p.unwrap_or(d * (k - 1) / 2);
    let out = |size: usize| (size + 2 * p - d * (k - 1) - 1) / s + 1;
    let (oh, ow) = (out(h), out(w));
    let (x, y) = match layout {
        Layout::Nchw => (vec![n, c, h, w], vec![n, co, oh, ow]),
        Layout::Nhwc => (vec![n, h, w, c], vec![n, oh, ow, co]),
    };
    let attrs = Conv2dAttrs {
        layout,
        stride: [s, s],
        padding: [p; 4],
        dilation: [d, d],
        groups: g,
    };
    Ok(Case {
        x,
        w: vec![co, c / g, k, k],
        y,
        attrs,
        dtype,
    })
}

#[test]
fn convolutions_take_their_pinned_routes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/routes");
    let n = kfuse_testkit::run_filetests(&dir, |header, input| {
        let isa = isa_of(header)?;
        let mut out = String::new();
        for line in input.lines().skip(1) {
            if line.starts_with('#') || line.trim().is_empty() {
                out.push_str(line);
                out.push('\n');
                continue;
            }
            let case = parse_case(line)?;
            let decision = decide(&case.x, &case.w, &case.attrs, &case.y, case.dtype, isa);
            out.push_str(&format!("{line}: {:?}\n", decision.route));
            for (route, why) in &decision.declined {
                out.push_str(&format!("    {route} declined: {why}\n"));
            }
        }
        Ok(out)
    });
    assert!(n >= 2);
}

/// The table's file format is read as documented: a bad line is an error, not a skip.
#[test]
fn bad_route_lines_are_errors() {
    assert!(parse_case("8 64 56 56 -> 64 k3 s2 p1 g1 d1 nhwc f64").is_ok());
    assert!(parse_case("8 64 56 -> 64 k3").is_err());
    assert!(parse_case("8 64 56 56 -> 64").is_err());
    assert!(parse_case("8 64 56 56 -> 64 k3 q7").is_err());
    assert!(isa_of("# conv2d routes: avx512, 2 threads").is_ok());
    assert!(isa_of("# conv2d routes: sse, 2 threads").is_err());
}
