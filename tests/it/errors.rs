//! Bad input gets a clear one-line error and never panics.
