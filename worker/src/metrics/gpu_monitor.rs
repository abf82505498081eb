//! NVML readings for the rank's GPU: memory used as the driver sees it, power, cumulative energy
//! and utilisation. NVML ignores CUDA_VISIBLE_DEVICES, so the device is found by its UUID.

use std::sync::OnceLock;

use nvml_wrapper::{Device, Nvml};

static NVML: OnceLock<Option<Nvml>> = OnceLock::new();

pub struct GpuMonitor {
    device: Device<'static>,
    energy_at_start_mj: Option<u64>,
}

/// One reading.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuReading {
    pub used_bytes: Option<u64>,
    pub power_w: Option<f64>,
    pub energy_j: Option<f64>,
    pub util_pct: Option<u32>,
}

impl GpuMonitor {
    /// The monitor of the GPU with this UUID, if NVML is present and knows it.
    pub fn open(uuid: &str) -> Option<Self> {
        let nvml = NVML.get_or_init(|| Nvml::init().ok()).as_ref()?;
        let device = nvml.device_by_uuid(uuid).ok()?;
        let energy_at_start_mj = device.total_energy_consumption().ok();
        Some(Self { device, energy_at_start_mj })
    }

    /// The driver version NVML reports.
    pub fn driver_version() -> Option<String> {
        NVML.get_or_init(|| Nvml::init().ok()).as_ref()?.sys_driver_version().ok()
    }

    pub fn read(&self) -> GpuReading {
        GpuReading {
            used_bytes: self.device.memory_info().ok().map(|m| m.used),
            power_w: self.device.power_usage().ok().map(|mw| f64::from(mw) / 1e3),
            energy_j: match (self.energy_at_start_mj, self.device.total_energy_consumption().ok()) {
                (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e3),
                _ => None,
            },
            util_pct: self.device.utilization_rates().ok().map(|u| u.gpu),
        }
    }
}
