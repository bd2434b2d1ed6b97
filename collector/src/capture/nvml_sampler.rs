//! Device truth from NVML, loaded at run time (never linked): device descriptions, then
//! total/free/used memory and per-process used memory every interval and once at the end, as
//! `Device` and `DeviceSample` records. The collector never initialises CUDA itself.
//!
//! Device numbering: NVML indexes physical GPUs; the traced program's CUDA ordinals follow
//! `CUDA_VISIBLE_DEVICES` when it is set (indices or UUIDs). Without it, CUDA ordinal i is taken
//! to be NVML index i (true with `CUDA_DEVICE_ORDER=PCI_BUS_ID` or a single GPU).

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use analysis_core::format::{DeviceIdx, DeviceInfo, DeviceSample, ProcessUsage, Record};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

/// Where NVML is looked for when no path is given.
pub const DEFAULT_NAMES: &[&str] = &["libnvidia-ml.so.1", "libnvidia-ml.so"];

/// Opens NVML from `explicit` or the default names. The error says what was tried.
pub fn open(explicit: Option<&OsStr>) -> Result<Nvml, String> {
    let names: Vec<&OsStr> = match explicit {
        Some(p) => vec![p],
        None => DEFAULT_NAMES.iter().map(OsStr::new).collect(),
    };
    let mut errors = Vec::new();
    for n in &names {
        match Nvml::builder().lib_path(n).init() {
            Ok(nvml) => return Ok(nvml),
            Err(e) => errors.push(format!("{} ({e})", n.to_string_lossy())),
        }
    }
    Err(format!(
        "NVML was not found or did not start, so device memory samples are not recorded \
         (pass --nvml PATH or set GPUCOLLECT_NVML_PATH); tried: {}",
        errors.join(", ")
    ))
}

/// Maps CUDA ordinals to NVML indices using CUDA_VISIBLE_DEVICES.
fn visible_devices(nvml: &Nvml) -> Vec<u32> {
    let count = nvml.device_count().unwrap_or(0);
    let Ok(spec) = std::env::var("CUDA_VISIBLE_DEVICES") else {
        return (0..count).collect();
    };
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Ok(i) = item.parse::<u32>() {
            if i < count {
                out.push(i);
            } else {
                break; // CUDA stops at the first invalid entry
            }
        } else if let Some(i) = (0..count).find(|&i| {
            nvml.device_by_index(i)
                .and_then(|d| d.uuid())
                .is_ok_and(|u| u.starts_with(item))
        }) {
            out.push(i);
        } else {
            break;
        }
    }
    out
}

/// Describes the devices and samples them every `interval` until `stop` is set, then once more.
/// Records go to `tx` with times from `now_nanos` (trace-relative).
pub fn run(
    nvml: Nvml,
    interval: Duration,
    stop: Arc<AtomicBool>,
    tx: Sender<Record>,
    now_nanos: impl Fn() -> u64,
) {
    let devices = visible_devices(&nvml);
    for (ordinal, &index) in devices.iter().enumerate() {
        if let Ok(d) = nvml.device_by_index(index) {
            let _ = tx.send(Record::Device(DeviceInfo {
                device: DeviceIdx(ordinal as u32),
                uuid: d.uuid().unwrap_or_default(),
                name: d.name().unwrap_or_default(),
                total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            }));
        }
    }
    loop {
        let last = stop.load(Ordering::Acquire);
        for (ordinal, &index) in devices.iter().enumerate() {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            let Ok(mem) = d.memory_info() else {
                continue;
            };
            let processes = d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| ProcessUsage {
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect();
            let sample = DeviceSample {
                ts_nanos: now_nanos(),
                device: DeviceIdx(ordinal as u32),
                total_bytes: mem.total,
                free_bytes: mem.free,
                used_bytes: mem.used,
                processes,
            };
            if tx.send(Record::DeviceSample(sample)).is_err() {
                return;
            }
        }
        if last {
            return;
        }
        let mut slept = Duration::ZERO;
        while slept < interval && !stop.load(Ordering::Acquire) {
            let step = Duration::from_millis(5).min(interval - slept);
            std::thread::sleep(step);
            slept += step;
        }
    }
}
