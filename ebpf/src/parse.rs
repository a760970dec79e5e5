//! Bounds-checked header access shared by every program.

/// Ethernet header length.
pub(crate) const ETH_HLEN: usize = 14;
/// Ethertypes (host byte order).
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86DD;
pub(crate) const ETH_P_ARP: u16 = 0x0806;

/// A pointer to `T` at `offset` in the packet, or `None` when the packet is too short.
#[inline(always)]
pub(crate) fn ptr_at<T>(data: usize, data_end: usize, offset: usize) -> Option<*const T> {
    let start = data.checked_add(offset)?;
    if start + core::mem::size_of::<T>() > data_end {
        return None;
    }
    Some(start as *const T)
}

/// The ethertype of the frame (host byte order), or `None` when it is shorter than an Ethernet header.
#[inline(always)]
pub(crate) fn ethertype(data: usize, data_end: usize) -> Option<u16> {
    let proto: *const [u8; 2] = ptr_at(data, data_end, 12)?;
    // SAFETY: bounds checked by `ptr_at`.
    Some(u16::from_be_bytes(unsafe { *proto }))
}

/// The IPv4 source address (network byte order) of a frame whose ethertype is IPv4.
#[inline(always)]
pub(crate) fn ipv4_source(data: usize, data_end: usize) -> Option<[u8; 4]> {
    let src: *const [u8; 4] = ptr_at(data, data_end, ETH_HLEN + 12)?;
    // SAFETY: bounds checked by `ptr_at`.
    Some(unsafe { *src })
}

/// The IPv6 source address (network byte order) of a frame whose ethertype is IPv6.
#[inline(always)]
pub(crate) fn ipv6_source(data: usize, data_end: usize) -> Option<[u8; 16]> {
    let src: *const [u8; 16] = ptr_at(data, data_end, ETH_HLEN + 8)?;
    // SAFETY: bounds checked by `ptr_at`.
    Some(unsafe { *src })
}
