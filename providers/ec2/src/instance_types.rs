//! The instance type for a VM's cpu and memory when the ProviderConfig sets no `instanceType`.
//!
//! | type        | vCPU | memory  |
//! |-------------|------|---------|
//! | t3.nano     | 2    | 0.5 GiB |
//! | t3.micro    | 2    | 1 GiB   |
//! | t3.small    | 2    | 2 GiB   |
//! | t3.medium   | 2    | 4 GiB   |
//! | t3.large    | 2    | 8 GiB   |
//! | t3.xlarge   | 4    | 16 GiB  |
//! | t3.2xlarge  | 8    | 32 GiB  |
//! | m5.4xlarge  | 16   | 64 GiB  |
//! | m5.8xlarge  | 32   | 128 GiB |
//! | m5.12xlarge | 48   | 192 GiB |
//! | m5.16xlarge | 64   | 256 GiB |
//! | m5.24xlarge | 96   | 384 GiB |
//!
//! The first (smallest, cheapest) row with at least the requested vCPUs and memory wins.
//! General-purpose families only: burstable t3 up to 8 vCPUs, m5 above. A workload that needs
//! another family sets `instanceType` in the ProviderConfig.

/// `(name, vCPUs, memory in MiB)`, ordered by size.
const TABLE: &[(&str, u32, u64)] = &[
    ("t3.nano", 2, 512),
    ("t3.micro", 2, 1024),
    ("t3.small", 2, 2048),
    ("t3.medium", 2, 4096),
    ("t3.large", 2, 8192),
    ("t3.xlarge", 4, 16_384),
    ("t3.2xlarge", 8, 32_768),
    ("m5.4xlarge", 16, 65_536),
    ("m5.8xlarge", 32, 131_072),
    ("m5.12xlarge", 48, 196_608),
    ("m5.16xlarge", 64, 262_144),
    ("m5.24xlarge", 96, 393_216),
];

/// The smallest type with at least `cpu` vCPUs and `memory_mib` MiB, if any.
pub fn for_size(cpu: u32, memory_mib: u64) -> Option<&'static str> {
    TABLE
        .iter()
        .find(|(_, vcpu, mib)| *vcpu >= cpu && *mib >= memory_mib)
        .map(|(name, _, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_smallest_type_that_fits() {
        assert_eq!(for_size(1, 512), Some("t3.nano"));
        assert_eq!(for_size(1, 513), Some("t3.micro"));
        assert_eq!(for_size(2, 4096), Some("t3.medium"));
        assert_eq!(for_size(3, 1024), Some("t3.xlarge"));
        assert_eq!(for_size(4, 16_384), Some("t3.xlarge"));
        assert_eq!(for_size(8, 8192), Some("t3.2xlarge"));
        assert_eq!(for_size(9, 1024), Some("m5.4xlarge"));
        assert_eq!(for_size(2, 40_000), Some("m5.4xlarge"));
        assert_eq!(for_size(96, 393_216), Some("m5.24xlarge"));
    }

    #[test]
    fn nothing_fits_beyond_the_table() {
        assert_eq!(for_size(97, 1024), None);
        assert_eq!(for_size(1, 393_217), None);
    }

    #[test]
    fn table_is_ordered_by_size() {
        for pair in TABLE.windows(2) {
            let [(_, c1, m1), (_, c2, m2)] = pair else {
                unreachable!()
            };
            assert!(c1 <= c2 && m1 <= m2, "{pair:?}");
        }
    }
}
