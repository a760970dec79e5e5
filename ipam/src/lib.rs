//! Host-affine block IPAM (see `../shared/DESIGN.md` → IPAM).
