//! The seeded generator the kernels' unit tests draw their inputs from.

/// A xorshift generator: reproducible from its seed (which must not be 0).
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
