//! Learning-rate schedules: linear warmup from 0 over `warmup_steps`, then constant, linear decay
//! or cosine decay to `min_lr_ratio·lr` at `total_steps`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Decay {
    #[default]
    Constant,
    Linear,
    Cosine,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Schedule {
    pub lr: f64,
    pub warmup_steps: u64,
    pub decay: Decay,
    /// Where the decay ends (required for linear and cosine).
    pub total_steps: u64,
    pub min_lr_ratio: f64,
}

impl Default for Schedule {
    fn default() -> Self {
        Schedule {
            lr: 1e-6,
            warmup_steps: 0,
            decay: Decay::Constant,
            total_steps: 0,
            min_lr_ratio: 0.0,
        }
    }
}

impl Schedule {
    /// Checks that a decaying schedule knows where it ends.
    pub fn check(&self) -> Result<(), String> {
        if self.lr <= 0.0 || !self.lr.is_finite() {
            return Err(format!(
                "schedule.lr must be a positive number, got {}",
                self.lr
            ));
        }
        if self.decay != Decay::Constant && self.total_steps <= self.warmup_steps {
            return Err(format!(
                "schedule.total_steps ({}) must exceed schedule.warmup_steps ({}) for {:?} decay",
                self.total_steps, self.warmup_steps, self.decay
            ));
        }
        Ok(())
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let floor = self.min_lr_ratio;
        let factor = match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => floor + (1.0 - floor) * (1.0 - progress),
            Decay::Cosine => {
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        };
        self.lr * factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let s = Schedule {
            lr: 1.0,
            warmup_steps: 4,
            decay: Decay::Cosine,
            total_steps: 14,
            min_lr_ratio: 0.1,
        };
        assert_eq!(s.lr_at(0), 0.25);
        assert_eq!(s.lr_at(3), 1.0);
        assert!((s.lr_at(4) - 1.0).abs() < 1e-12);
        assert!((s.lr_at(9) - 0.55).abs() < 1e-12);
        assert!((s.lr_at(14) - 0.1).abs() < 1e-12);
        assert!((s.lr_at(100) - 0.1).abs() < 1e-12);
        let linear = Schedule {
            decay: Decay::Linear,
            ..s.clone()
        };
        assert!((linear.lr_at(9) - 0.55).abs() < 1e-12);
        assert!(Schedule {
            decay: Decay::Cosine,
            total_steps: 2,
            ..s
        }
        .check()
        .is_err());
    }
}
