//! The VirtualMachine and ProviderConfig reconcilers.
