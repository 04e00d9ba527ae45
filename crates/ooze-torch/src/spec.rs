//! Parsing of the device and dtype names users give on the command line and in configs.

use std::fmt;
use std::str::FromStr;
use tch::{Device, Kind};

/// A bad `--device` or `--dtype` value.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown device `{0}`; expected auto, cpu, cuda or cuda:N")]
    UnknownDevice(String),
    #[error("device `{name}` asked for, but {reason}")]
    DeviceUnavailable { name: String, reason: String },
    #[error("unknown dtype `{0}`; expected fp32 (float32) or bf16 (bfloat16)")]
    UnknownDtype(String),
}

/// Where to compute: `auto` picks the first GPU when there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" | "gpu" => Ok(DeviceSpec::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| SpecError::UnknownDevice(s.to_owned())),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// The libtorch device, checking that an asked-for GPU exists.
    pub fn resolve(self) -> Result<Device, SpecError> {
        match self {
            DeviceSpec::Auto => Ok(Device::cuda_if_available()),
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                let count = tch::Cuda::device_count();
                if (n as i64) < count {
                    Ok(Device::Cuda(n))
                } else {
                    Err(SpecError::DeviceUnavailable {
                        name: self.to_string(),
                        reason: format!("this process sees {count} CUDA device(s)"),
                    })
                }
            }
        }
    }
}

/// Parameter / activation precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypeSpec {
    #[default]
    F32,
    Bf16,
}

impl FromStr for DtypeSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" | "f32" | "float32" | "float" => Ok(DtypeSpec::F32),
            "bf16" | "bfloat16" => Ok(DtypeSpec::Bf16),
            _ => Err(SpecError::UnknownDtype(s.to_owned())),
        }
    }
}

impl fmt::Display for DtypeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DtypeSpec::F32 => "fp32",
            DtypeSpec::Bf16 => "bf16",
        })
    }
}

impl DtypeSpec {
    pub fn kind(self) -> Kind {
        match self {
            DtypeSpec::F32 => Kind::Float,
            DtypeSpec::Bf16 => Kind::BFloat16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!("auto".parse(), Ok(DeviceSpec::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        assert_eq!(
            "tpu".parse::<DeviceSpec>(),
            Err(SpecError::UnknownDevice("tpu".into()))
        );
        assert_eq!(
            "cuda:x".parse::<DeviceSpec>(),
            Err(SpecError::UnknownDevice("cuda:x".into()))
        );
        assert_eq!(DeviceSpec::Cpu.resolve(), Ok(Device::Cpu));
    }

    #[test]
    fn parses_dtypes() {
        assert_eq!("bf16".parse(), Ok(DtypeSpec::Bf16));
        assert_eq!("BFloat16".parse(), Ok(DtypeSpec::Bf16));
        assert_eq!("fp32".parse(), Ok(DtypeSpec::F32));
        assert!("fp8"
            .parse::<DtypeSpec>()
            .unwrap_err()
            .to_string()
            .contains("expected fp32"));
    }
}
