//! The pieces every product kernel shares: where a product starts its sums ([`Start`]) and the output
//! pointer its threads share ([`SendPtr`]). A leaf module that the packed products (`packed_gemm`), their int8
//! form (`quantized_gemm`) and the callers that pass a start read.

/// What a packed product adds its `a · B` to.
#[derive(Clone, Copy, Debug)]
pub enum Start<'b> {
    /// Nothing: `dst = a · B`.
    Zero,
    /// The destination's values: `dst += a · B`.
    Dst,
    /// One row (a bias) under every row: `dst = bias + a · B`, each element's sum taken in the order of adding
    /// `a · B` to a destination that holds the bias.
    Row(&'b [f32]),
}

/// A raw output pointer shared by the threads of one product (each writes its own columns).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub(crate) *mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
