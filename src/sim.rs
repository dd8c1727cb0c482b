//! The simulator (stub, being written).
