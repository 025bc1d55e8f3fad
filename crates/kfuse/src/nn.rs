//! Composite operations built from primitives. The fusion compiler must turn each into one
//! kernel; the interpreter runs them op by op.

use crate::Tensor;

impl Tensor {
    /// `exp(x - max) / sum(exp(x - max))` along `axis`.
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Tensor {
        let shifted = self - &self.max(&[axis], true);
        let e = shifted.exp();
        &e / &e.sum(&[axis], true)
    }

    /// `(x - max) - log(sum(exp(x - max)))` along `axis`.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Tensor {
        let shifted = self - &self.max(&[axis], true);
        &shifted - &shifted.exp().sum(&[axis], true).log()
    }

    /// Layer normalization over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`,
    /// with the biased variance.
    #[track_caller]
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f64) -> Tensor {
        let centered = self - &self.mean(&[-1], true);
        let var = (&centered * &centered).mean(&[-1], true);
        &(&centered * &(var + eps).rsqrt()) * gamma + beta
    }

    /// RMS normalization over the last axis: `x / sqrt(mean(x^2) + eps) * gamma`.
    #[track_caller]
    pub fn rms_norm(&self, gamma: &Tensor, eps: f64) -> Tensor {
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
    #[track_caller]
    pub fn cross_entropy(&self, labels: &Tensor) -> Tensor {
        let log_probs = self.log_softmax(-1);
        let picked = log_probs.gather(1, &labels.unsqueeze(1));
        -picked.mean_all()
    }
}
