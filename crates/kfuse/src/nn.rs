//! Neural-network composites built from primitives. The fusion compiler must turn each
//! activation and normalization into one kernel (or fold it into the matmul or convolution
//! before it); the interpreter runs them op by op. A transposed convolution is an ordinary
//! convolution of a spread-out input, so it runs on the convolution routines.

use std::panic::Location;

use kfuse_ir::{Conv2dAttrs, Layout, Op, PadMode, Shape};

use crate::{where_, Tensor};

/// Attributes of [`Tensor::conv_transpose2d`], as PyTorch's `ConvTranspose2d` takes them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTranspose2dAttrs {
    /// The layout of the input and output activations; the weight is `[C_in, C_out / groups,
    /// KH, KW]` in both.
    pub layout: Layout,
    /// The stride of the convolution this one transposes: output rows per input row.
    pub stride: [usize; 2],
    /// Rows (columns) removed from both sides of the output, along H and W.
    pub padding: [usize; 2],
    /// Rows (columns) added at the bottom (right) of the output, to reach the sizes a strided
    /// convolution maps to one size; each must be below the stride or the dilation.
    pub output_padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for ConvTranspose2dAttrs {
    /// NCHW, stride 1, no padding, no dilation, one group.
    fn default() -> Self {
        ConvTranspose2dAttrs {
            layout: Layout::Nchw,
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Tensor {
    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let p = cx.tensor(&[1.0f32, 1.0, 1.0, 1.0], &[2, 2]).softmax(-1);
    /// assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.5; 4]);
    /// ```
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        if let Some(error) = self.axis_error(Location::caller(), "softmax", axis) {
            return error;
        }
        let shifted = self - &self.max(&[axis], true);
        let e = shifted.exp();
        &e / &e.sum(&[axis], true)
    }

    /// `(x - max) - log(sum(exp(x - max)))` along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        if let Some(error) = self.axis_error(Location::caller(), "log_softmax", axis) {
            return error;
        }
        let shifted = self - &self.max(&[axis], true);
        &shifted - &shifted.exp().sum(&[axis], true).log()
    }

    /// Layer normalization over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`,
    /// with the biased variance.
    #[track_caller]
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f64) -> Tensor {
        if let Some(error) = self.axis_error(Location::caller(), "layer_norm", -1) {
            return error;
        }
        let centered = self - &self.mean(&[-1], true);
        let var = (&centered * &centered).mean(&[-1], true);
        &(&centered * &(var + eps).rsqrt()) * gamma + beta
    }

    /// RMS normalization over the last axis: `x / sqrt(mean(x^2) + eps) * gamma`.
    #[track_caller]
    pub fn rms_norm(&self, gamma: &Tensor, eps: f64) -> Tensor {
        if let Some(error) = self.axis_error(Location::caller(), "rms_norm", -1) {
            return error;
        }
        let ms = (self * self).mean(&[-1], true);
        &(self * &(ms + eps).rsqrt()) * gamma
    }

    /// A dense layer `x @ w + b` with `w` of shape `[in, out]`.
    #[track_caller]
    pub fn linear(&self, w: &Tensor, b: Option<&Tensor>) -> Tensor {
        let y = self.matmul(w);
        match b {
            Some(b) => y + b,
            None => y,
        }
    }

    /// Mean cross-entropy of `[N, C]` logits against `[N]` integer class labels:
    /// `-mean(log_softmax(logits)[i, labels[i]])`.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let logits = cx.tensor(&[0.0f32, 0.0, 5.0, -5.0], &[2, 2]);
    /// let loss = logits.cross_entropy(&cx.tensor(&[1i64, 0], &[2]));
    /// let want = (std::f32::consts::LN_2 + (1.0 + (-10.0f32).exp()).ln()) / 2.0;
    /// assert!((loss.to_vec::<f32>().unwrap()[0] - want).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn cross_entropy(&self, labels: &Tensor) -> Tensor {
        let log_probs = self.log_softmax(-1);
        let picked = log_probs.gather(1, &labels.unsqueeze(1));
        -picked.mean_all()
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let y = cx.tensor(&[0.0f32, 1.0], &[2]).silu().to_vec::<f32>().unwrap();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    /// ```
    #[track_caller]
    pub fn silu(&self) -> Tensor {
        self * &self.sigmoid()
    }

    /// `x` where `x >= 0`, else `negative_slope * x` (PyTorch `leaky_relu`; NaN stays NaN).
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let y = cx.tensor(&[-2.0f32, 3.0], &[2]).leaky_relu(0.25);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![-0.5, 3.0]);
    /// ```
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Tensor {
        where_(&self.ge(0), self, self * negative_slope)
    }

    /// Batch normalization in inference form over axis 1 (the channels of `[N, C, ...]`):
    /// `(x - mean) / sqrt(var + eps) * gamma + beta` with each statistic and parameter of shape
    /// `[C]`; a missing `gamma` is 1 and a missing `beta` 0.
    ///
    /// It is written as the chain the graph passes fold into a preceding convolution or matmul
    /// with constant weights, so that, with constant statistics, a batchnorm after one costs
    /// nothing in fast numerics.
    ///
    /// ```
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let mean = cx.tensor(&[1.0f32, 2.0], &[2]);
    /// let var = cx.tensor(&[4.0f32, 1.0], &[2]);
    /// let y = x.batch_norm(&mean, &var, None, Some(&cx.tensor(&[0.0f32, 10.0], &[2])), 0.0);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 10.0, 1.0, 12.0]);
    /// ```
    #[track_caller]
    pub fn batch_norm(
        &self,
        mean: &Tensor,
        var: &Tensor,
        gamma: Option<&Tensor>,
        beta: Option<&Tensor>,
        eps: f64,
    ) -> Tensor {
        let loc = Location::caller();
        let mut params = vec![("mean", mean), ("var", var)];
        params.extend(gamma.map(|g| ("gamma", g)));
        params.extend(beta.map(|b| ("beta", b)));
        if let Some(failed) = std::iter::once(self)
            .chain(params.iter().map(|p| p.1))
            .find(|t| !t.is_ok())
        {
            return failed.clone();
        }
        let dims = self.dims();
        if dims.len() < 2 {
            return self.cx.error(
                loc,
                format!(
                    "batch_norm: expects at least 2 axes ([N, C, ...]), found rank {}",
                    dims.len()
                ),
            );
        }
        for (name, p) in &params {
            if p.dims() != [dims[1]] {
                return self.cx.error(
                    loc,
                    format!(
                        "batch_norm: {name} has shape {:?}, expected [{}] (one per channel)",
                        p.dims(),
                        dims[1]
                    ),
                );
            }
        }
        // [C] -> [C, 1, ..., 1], which broadcasts along every axis but the channels.
        let mut per_channel = vec![dims[1] as isize];
        per_channel.resize(dims.len() - 1, 1);
        let mut y = (self - mean.reshape(&per_channel)) / (var.reshape(&per_channel) + eps).sqrt();
        if let Some(gamma) = gamma {
            y = y * gamma.reshape(&per_channel);
        }
        if let Some(beta) = beta {
            y = y + beta.reshape(&per_channel);
        }
        y
    }

    /// Transposed 2-D convolution (PyTorch `conv_transpose2d`), the gradient of a convolution
    /// with respect to its input: each input element scatters `weight` times itself into the
    /// output. The weight is `[C_in, C_out / groups, KH, KW]`; an output axis is
    /// `(in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1` long.
    ///
    /// It runs as an ordinary convolution, so it fuses and uses the convolution routines: the
    /// input is spread out with `stride - 1` zeros between elements, padded by
    /// `dilation * (k - 1) - padding` (cropped where that is negative), and convolved with the
    /// weight flipped in H and W and its channel axes swapped per group. Those inserted zeros
    /// meet the weights, so a weight that is infinite or NaN gives NaN at outputs it would not
    /// reach in PyTorch's scatter form.
    ///
    /// ```
    /// use kfuse::{ConvTranspose2dAttrs, DType};
    /// let cx = kfuse::Context::new();
    /// let x = cx.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[1, 1, 2, 2]);
    /// let w = cx.ones(DType::F32, &[1, 1, 2, 2]);
    /// let attrs = ConvTranspose2dAttrs { stride: [2, 2], ..Default::default() };
    /// let y = x.conv_transpose2d(&w, &attrs);
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![
    ///     1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0,
    /// ]);
    /// ```
    #[track_caller]
    pub fn conv_transpose2d(&self, weight: &Tensor, attrs: &ConvTranspose2dAttrs) -> Tensor {
        let loc = Location::caller();
        if !self.is_ok() {
            return self.clone();
        }
        if !weight.is_ok() {
            return weight.clone();
        }
        let fail = |message: String| self.cx.error(loc, format!("conv_transpose2d: {message}"));
        let (x_dims, w_dims) = (self.dims(), weight.dims());
        if x_dims.len() != 4 || w_dims.len() != 4 {
            return fail(format!(
                "expects a rank-4 input and weight, found {x_dims:?} and {w_dims:?}"
            ));
        }
        let (channel_axis, spatial) = match attrs.layout {
            Layout::Nchw => (1, [2, 3]),
            Layout::Nhwc => (3, [1, 2]),
        };
        let groups = attrs.groups;
        let c_in = x_dims[channel_axis];
        if groups == 0 || c_in % groups != 0 {
            return fail(format!(
                "{c_in} input channels do not split into {groups} groups"
            ));
        }
        if w_dims[0] != c_in {
            return fail(format!(
                "the weight {w_dims:?} is [C_in, C_out / groups, KH, KW] with C_in = {c_in}"
            ));
        }
        // Per spatial axis: the inserted zeros, then the padding on each side (negative: crop).
        let mut x = self.clone();
        let mut conv_padding = [0usize; 4];
        for (i, &axis) in spatial.iter().enumerate() {
            let (stride, dilation) = (attrs.stride[i], attrs.dilation[i]);
            let (pad, extra) = (attrs.padding[i], attrs.output_padding[i]);
            let (n, k) = (x_dims[axis], w_dims[2 + i]);
            if stride == 0 || dilation == 0 {
                return fail(format!(
                    "stride {:?} and dilation {:?} must be at least 1",
                    attrs.stride, attrs.dilation
                ));
            }
            if extra >= stride.max(dilation) {
                return fail(format!(
                    "output_padding {:?} must be below the stride or the dilation",
                    attrs.output_padding
                ));
            }
            if n == 0 || k == 0 {
                return fail(format!(
                    "spatial axes of size 0 are not supported (input {x_dims:?}, weight {w_dims:?})"
                ));
            }
            let reach = (dilation * (k - 1)) as isize;
            let out = ((n - 1) * stride + 1) as isize + reach - 2 * pad as isize + extra as isize;
            if out < 1 {
                return fail(format!(
                    "the output would have {out} rows or columns along axis {axis}"
                ));
            }
            x = spread(&x, axis, stride);
            let (low, high) = (reach - pad as isize, reach - pad as isize + extra as isize);
            // Crops where the padding exceeds the kernel's reach; the rest is the convolution's
            // own zero padding.
            let crop_low = (-low).max(0) as usize;
            let crop_high = (-high).max(0) as usize;
            if crop_low + crop_high > 0 {
                let len = x.dims()[axis] - crop_low - crop_high;
                x = x.narrow(axis as isize, crop_low, len);
            }
            conv_padding[2 * i] = low.max(0) as usize;
            conv_padding[2 * i + 1] = high.max(0) as usize;
        }
        // [C_in, C_out/g, KH, KW] -> [g, C_in/g, C_out/g, KH, KW] -> [g, C_out/g, C_in/g, KH, KW]
        // -> [C_out, C_in/g, KH, KW], flipped in H and W.
        let (per_in, per_out) = ((c_in / groups) as isize, w_dims[1] as isize);
        let (kh, kw) = (w_dims[2] as isize, w_dims[3] as isize);
        let w = weight
            .reshape(&[groups as isize, per_in, per_out, kh, kw])
            .permute(&[0, 2, 1, 3, 4])
            .reshape(&[groups as isize * per_out, per_in, kh, kw])
            .flip(&[2, 3]);
        x.conv2d(
            &w,
            Conv2dAttrs {
                layout: attrs.layout,
                stride: [1, 1],
                padding: conv_padding,
                dilation: attrs.dilation,
                groups,
            },
        )
    }
}

/// `x` with `stride - 1` zeros between consecutive elements along `axis`: `[a, b]` with stride
/// 3 becomes `[a, 0, 0, b]`. Written as a reshape that gives each element an axis of its own,
/// a pad of that axis, a reshape back and a slice of the trailing zeros.
#[track_caller]
fn spread(x: &Tensor, axis: usize, stride: usize) -> Tensor {
    if stride == 1 {
        return x.clone();
    }
    let loc = Location::caller();
    let dims = x.dims();
    let mut split = dims.clone();
    split.insert(axis + 1, 1);
    let mut widths = vec![(0, 0); split.len()];
    widths[axis + 1] = (0, stride - 1);
    let mut merged = dims.clone();
    merged[axis] *= stride;
    let spread = x
        .op(
            loc,
            Op::Reshape {
                shape: Shape::new(split),
            },
            &[],
        )
        .pad(&widths, PadMode::Constant, 0.0)
        .op(
            loc,
            Op::Reshape {
                shape: Shape::new(merged),
            },
            &[],
        );
    spread.narrow(axis as isize, 0, (dims[axis] - 1) * stride + 1)
}
