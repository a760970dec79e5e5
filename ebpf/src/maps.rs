//! Every map the programs use. Names and sizes come from `maps_schema::maps` (the name literals must
//! match it; the verifier gate checks). Maps only the agent writes are `BPF_F_RDONLY_PROG`.

use aya_ebpf::{
    btf_maps::{HashMap, PerCpuArray},
    macros::btf_map,
};
use maps_schema::{
    CounterValue, EndpointInfo,
    maps::{BPF_F_RDONLY_PROG, COUNTERS_MAX, ENDPOINTS_MAX},
};

/// ifindex → endpoint.
#[btf_map(name = "endpoints_v1", pin_by_name)]
pub(crate) static ENDPOINTS: HashMap<
    u32,
    EndpointInfo,
    { ENDPOINTS_MAX as usize },
    BPF_F_RDONLY_PROG,
> = HashMap::new();

/// (reason, direction) → packets and bytes, per CPU.
#[btf_map(name = "counters_v1", pin_by_name)]
pub(crate) static COUNTERS: PerCpuArray<CounterValue, { COUNTERS_MAX as usize }> =
    PerCpuArray::new();
