//! The `vmop.dev/v1alpha1` resources: `VirtualMachine` and `ProviderConfig`.
