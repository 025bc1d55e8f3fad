//! Composite operations built from primitives. The fusion compiler must turn each into one
//! kernel; the interpreter runs them op by op.

use std::panic::Location;

use crate::Tensor;

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
}
