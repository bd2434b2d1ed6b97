//! CUPTI and driver constants and parameter layouts, and the dynamically loaded libcupti.
//!
//! Values and layouts follow the public CUPTI/driver headers (same from CUDA 11.4 to 13.x).
//! Domains and callback ids are plain `u32`: an unknown value must never be undefined behaviour.

use core::ffi::{c_char, c_int, c_void};

pub const DOMAIN_DRIVER_API: u32 = 1;
pub const SITE_ENTER: c_int = 0;
pub const SITE_EXIT: c_int = 1;
pub const ERROR_MULTIPLE_SUBSCRIBERS: c_int = 39;

/// Driver API callback ids.
pub mod cbid {
    /// Legacy (pre-_v2) context teardown ids; same parameter layouts as the _v2 ones.
    pub const CTX_DESTROY: u32 = 11;
    pub const DEVICE_PRIMARY_CTX_RESET: u32 = 389;
    pub const MEM_FREE_HOST: u32 = 38;
    pub const MEM_HOST_ALLOC: u32 = 39;
    pub const ARRAY_DESTROY: u32 = 89;
    pub const MEM_ALLOC_V2: u32 = 243;
    pub const MEM_ALLOC_PITCH_V2: u32 = 244;
    pub const MEM_FREE_V2: u32 = 245;
    pub const ARRAY_CREATE_V2: u32 = 272;
    pub const ARRAY_3D_CREATE_V2: u32 = 274;
    pub const MEM_ALLOC_HOST_V2: u32 = 294;
    pub const MEM_HOST_UNREGISTER: u32 = 302;
    pub const CTX_DESTROY_V2: u32 = 322;
    pub const IPC_CLOSE_MEM_HANDLE: u32 = 330;
    pub const MEM_ALLOC_MANAGED: u32 = 371;
    pub const MEM_HOST_REGISTER_V2: u32 = 379;
    pub const DEVICE_PRIMARY_CTX_RESET_V2: u32 = 545;
    pub const MEM_CREATE: u32 = 549;
    pub const MEM_RELEASE: u32 = 550;
    pub const MEM_MAP: u32 = 551;
    pub const MEM_UNMAP: u32 = 552;
    pub const IPC_OPEN_MEM_HANDLE_V2: u32 = 567;
    pub const MEM_ALLOC_ASYNC: u32 = 598;
    pub const MEM_ALLOC_ASYNC_PTSZ: u32 = 599;
    pub const MEM_FREE_ASYNC: u32 = 600;
    pub const MEM_FREE_ASYNC_PTSZ: u32 = 601;
    pub const MEM_POOL_TRIM_TO: u32 = 602;
    pub const MEM_POOL_CREATE: u32 = 607;
    pub const MEM_POOL_DESTROY: u32 = 608;
    pub const MEM_ALLOC_FROM_POOL_ASYNC: u32 = 611;
    pub const MEM_ALLOC_FROM_POOL_ASYNC_PTSZ: u32 = 612;
    pub const GRAPH_ADD_MEM_ALLOC_NODE: u32 = 638;

    /// Every callback the injection enables.
    pub const ALL: &[u32] = &[
        CTX_DESTROY,
        DEVICE_PRIMARY_CTX_RESET,
        MEM_FREE_HOST,
        MEM_HOST_ALLOC,
        ARRAY_DESTROY,
        MEM_ALLOC_V2,
        MEM_ALLOC_PITCH_V2,
        MEM_FREE_V2,
        ARRAY_CREATE_V2,
        ARRAY_3D_CREATE_V2,
        MEM_ALLOC_HOST_V2,
        MEM_HOST_UNREGISTER,
        CTX_DESTROY_V2,
        IPC_CLOSE_MEM_HANDLE,
        MEM_ALLOC_MANAGED,
        MEM_HOST_REGISTER_V2,
        DEVICE_PRIMARY_CTX_RESET_V2,
        MEM_CREATE,
        MEM_RELEASE,
        MEM_MAP,
        MEM_UNMAP,
        IPC_OPEN_MEM_HANDLE_V2,
        MEM_ALLOC_ASYNC,
        MEM_ALLOC_ASYNC_PTSZ,
        MEM_FREE_ASYNC,
        MEM_FREE_ASYNC_PTSZ,
        MEM_ALLOC_FROM_POOL_ASYNC,
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
        MEM_POOL_TRIM_TO,
        MEM_POOL_CREATE,
        MEM_POOL_DESTROY,
        GRAPH_ADD_MEM_ALLOC_NODE,
    ];
}

/// `CUpti_CallbackData`.
///
/// Every struct below is checked at compile time against its C header (size and field offsets,
/// `c_layout!`). A struct that mirrors only the head of a longer C struct says so and is checked
/// for that head; the rest is never read.
#[repr(C)]
pub struct CallbackData {
    pub callback_site: c_int,
    pub function_name: *const c_char,
    pub function_params: *const c_void,
    pub function_return_value: *mut c_void,
    pub symbol_name: *const c_char,
    pub context: *mut c_void,
    pub context_uid: u32,
    pub correlation_data: *mut u64,
    pub correlation_id: u32,
}

pub type CallbackFn = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
pub type SubscribeFn = unsafe extern "C" fn(*mut *mut c_void, CallbackFn, *mut c_void) -> c_int;
pub type EnableCallbackFn = unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> c_int;
pub type GetDeviceIdFn = unsafe extern "C" fn(*mut c_void, *mut u32) -> c_int;

c_layout!(CallbackData, size 72, callback_site @ 0, function_name @ 8, function_params @ 16,
    function_return_value @ 24, symbol_name @ 32, context @ 40, context_uid @ 48,
    correlation_data @ 56, correlation_id @ 64);

// Parameter structs (generated_cuda_meta.h).
#[repr(C)]
pub struct MemAllocParams {
    pub dptr: *mut u64,
    pub bytesize: usize,
}
#[repr(C)]
pub struct MemAllocPitchParams {
    pub dptr: *mut u64,
    pub pitch: *mut usize,
    pub width_bytes: usize,
    pub height: usize,
    pub element_bytes: u32,
}
#[repr(C)]
pub struct PtrFreeParams {
    pub dptr: u64,
}
#[repr(C)]
pub struct HostAllocParams {
    pub pp: *mut *mut c_void,
    pub bytesize: usize,
}
#[repr(C)]
pub struct MemAllocAsyncParams {
    pub dptr: *mut u64,
    pub bytesize: usize,
    pub stream: u64,
}
#[repr(C)]
pub struct MemAllocFromPoolAsyncParams {
    pub dptr: *mut u64,
    pub bytesize: usize,
    pub pool: u64,
    pub stream: u64,
}
#[repr(C)]
pub struct MemFreeAsyncParams {
    pub dptr: u64,
    pub stream: u64,
}
#[repr(C)]
pub struct MemPoolCreateParams {
    pub pool: *mut u64,
    /// `const CUmemPoolProps*`: alloc type u32, handle types u32, location {type u32, id i32}.
    pub props: *const u32,
}
#[repr(C)]
pub struct GraphAddMemAllocNodeParams {
    pub node: *mut *mut c_void,
    pub graph: *mut c_void,
    pub dependencies: *const c_void,
    pub num_dependencies: usize,
    /// `CUDA_MEM_ALLOC_NODE_PARAMS*`: starts with a `CUmemPoolProps` (location at offset 8).
    pub node_params: *const u32,
}
#[repr(C)]
pub struct MemCreateParams {
    pub handle: *mut u64,
    pub size: usize,
    /// `const CUmemAllocationProp*`: type u32, handle types u32, location {type u32, id i32}.
    pub prop: *const u32,
    pub flags: u64,
}
#[repr(C)]
pub struct MemMapParams {
    pub ptr: u64,
    pub size: usize,
    pub offset: usize,
    pub handle: u64,
    pub flags: u64,
}
#[repr(C)]
pub struct MemUnmapParams {
    pub ptr: u64,
    pub size: usize,
}
#[repr(C)]
pub struct ArrayCreateParams {
    pub handle: *mut u64,
    /// `CUDA_ARRAY_DESCRIPTOR*` (Width, Height, Format u32, NumChannels u32) or, for 3D,
    /// `CUDA_ARRAY3D_DESCRIPTOR*` (Width, Height, Depth, Format, NumChannels, Flags).
    pub desc: *const usize,
}
#[repr(C)]
pub struct IpcOpenParams {
    pub pdptr: *mut u64,
}
#[repr(C)]
pub struct CtxDestroyParams {
    pub ctx: *mut c_void,
}
#[repr(C)]
pub struct PrimaryCtxResetParams {
    pub dev: c_int,
}
/// `cuMemHostRegister_v2_params`.
#[repr(C)]
pub struct MemHostRegisterParams {
    pub p: *mut c_void,
    pub bytesize: usize,
    pub flags: u32,
}

// Layouts of generated_cuda_meta.h (CUDA 11.4 to 13.x).
// `cuMemAlloc_v2_params`, and the head of `cuMemAllocManaged_params` (+ flags at 16).
c_layout!(MemAllocParams, size 16, dptr @ 0, bytesize @ 8);
c_layout!(MemAllocPitchParams, size 40, dptr @ 0, pitch @ 8, width_bytes @ 16, height @ 24,
    element_bytes @ 32);
// `cuMemFree_v2_params`; also the one-handle `cuMemFreeHost`, `cuMemHostUnregister`,
// `cuIpcCloseMemHandle`, `cuArrayDestroy`, `cuMemRelease` and `cuMemPoolDestroy` params (a
// pointer or 64-bit handle at 0).
c_layout!(PtrFreeParams, size 8, dptr @ 0);
// `cuMemAllocHost_v2_params`, and the head of `cuMemHostAlloc_params` (+ Flags at 16).
c_layout!(HostAllocParams, size 16, pp @ 0, bytesize @ 8);
c_layout!(MemAllocAsyncParams, size 24, dptr @ 0, bytesize @ 8, stream @ 16);
c_layout!(MemAllocFromPoolAsyncParams, size 32, dptr @ 0, bytesize @ 8, pool @ 16, stream @ 24);
c_layout!(MemFreeAsyncParams, size 16, dptr @ 0, stream @ 8);
c_layout!(MemPoolCreateParams, size 16, pool @ 0, props @ 8);
c_layout!(GraphAddMemAllocNodeParams, size 40, node @ 0, graph @ 8, dependencies @ 16,
    num_dependencies @ 24, node_params @ 32);
c_layout!(MemCreateParams, size 32, handle @ 0, size @ 8, prop @ 16, flags @ 24);
c_layout!(MemMapParams, size 40, ptr @ 0, size @ 8, offset @ 16, handle @ 24, flags @ 32);
c_layout!(MemUnmapParams, size 16, ptr @ 0, size @ 8);
// `cuArrayCreate_v2_params` and `cuArray3DCreate_v2_params`.
c_layout!(ArrayCreateParams, size 16, handle @ 0, desc @ 8);
// The head of `cuIpcOpenMemHandle_v2_params` (then a 64-byte CUipcMemHandle and Flags).
c_layout!(IpcOpenParams, size 8, pdptr @ 0);
// `cuCtxDestroy_v2_params` and `cuCtxDestroy_params`.
c_layout!(CtxDestroyParams, size 8, ctx @ 0);
// `cuDevicePrimaryCtxReset_v2_params` (`CUdevice` is an int).
c_layout!(PrimaryCtxResetParams, size 4, dev @ 0);
c_layout!(MemHostRegisterParams, size 24, p @ 0, bytesize @ 8, flags @ 16);

/// A driver parameter struct (`generated_cuda_meta.h`) and the callbacks it belongs to.
pub trait Params {
    /// The callback ids whose `functionParams` have this layout (or start with it).
    const CBIDS: &'static [u32];
}

macro_rules! params_of {
    ($($t:ty => [$($id:expr),+ $(,)?];)*) => {
        $(impl Params for $t {
            const CBIDS: &'static [u32] = &[$($id),+];
        })*
    };
}

params_of! {
    MemAllocParams => [cbid::MEM_ALLOC_V2, cbid::MEM_ALLOC_MANAGED];
    MemAllocPitchParams => [cbid::MEM_ALLOC_PITCH_V2];
    PtrFreeParams => [
        cbid::MEM_FREE_V2,
        cbid::MEM_FREE_HOST,
        cbid::MEM_HOST_UNREGISTER,
        cbid::IPC_CLOSE_MEM_HANDLE,
        cbid::ARRAY_DESTROY,
        cbid::MEM_RELEASE,
        cbid::MEM_POOL_DESTROY,
    ];
    HostAllocParams => [cbid::MEM_ALLOC_HOST_V2, cbid::MEM_HOST_ALLOC];
    MemAllocAsyncParams => [cbid::MEM_ALLOC_ASYNC, cbid::MEM_ALLOC_ASYNC_PTSZ];
    MemAllocFromPoolAsyncParams => [
        cbid::MEM_ALLOC_FROM_POOL_ASYNC,
        cbid::MEM_ALLOC_FROM_POOL_ASYNC_PTSZ,
    ];
    MemFreeAsyncParams => [cbid::MEM_FREE_ASYNC, cbid::MEM_FREE_ASYNC_PTSZ];
    MemPoolCreateParams => [cbid::MEM_POOL_CREATE];
    GraphAddMemAllocNodeParams => [cbid::GRAPH_ADD_MEM_ALLOC_NODE];
    MemCreateParams => [cbid::MEM_CREATE];
    MemMapParams => [cbid::MEM_MAP];
    MemUnmapParams => [cbid::MEM_UNMAP];
    ArrayCreateParams => [cbid::ARRAY_CREATE_V2, cbid::ARRAY_3D_CREATE_V2];
    IpcOpenParams => [cbid::IPC_OPEN_MEM_HANDLE_V2];
    CtxDestroyParams => [cbid::CTX_DESTROY_V2, cbid::CTX_DESTROY];
    PrimaryCtxResetParams => [cbid::DEVICE_PRIMARY_CTX_RESET_V2, cbid::DEVICE_PRIMARY_CTX_RESET];
    MemHostRegisterParams => [cbid::MEM_HOST_REGISTER_V2];
}

/// Bytes per element of a CUarray_format (approximate for block-compressed formats).
pub const fn array_format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_enabled_callback_has_at_most_one_parameter_layout() {
        let layouts: [&[u32]; 17] = [
            MemAllocParams::CBIDS,
            MemAllocPitchParams::CBIDS,
            PtrFreeParams::CBIDS,
            HostAllocParams::CBIDS,
            MemAllocAsyncParams::CBIDS,
            MemAllocFromPoolAsyncParams::CBIDS,
            MemFreeAsyncParams::CBIDS,
            MemPoolCreateParams::CBIDS,
            GraphAddMemAllocNodeParams::CBIDS,
            MemCreateParams::CBIDS,
            MemMapParams::CBIDS,
            MemUnmapParams::CBIDS,
            ArrayCreateParams::CBIDS,
            IpcOpenParams::CBIDS,
            CtxDestroyParams::CBIDS,
            PrimaryCtxResetParams::CBIDS,
            MemHostRegisterParams::CBIDS,
        ];
        for id in cbid::ALL {
            let n = layouts.iter().filter(|l| l.contains(id)).count();
            assert!(n <= 1, "callback {id} has {n} parameter layouts");
        }
        for id in layouts.iter().flat_map(|l| l.iter()) {
            assert!(cbid::ALL.contains(id), "callback {id} is never enabled");
        }
    }
}
