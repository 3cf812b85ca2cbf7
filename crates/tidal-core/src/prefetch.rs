//! Hints to the CPU to start loading cache lines that the fold will touch soon.
//!
//! The signal fold touches one user's entry and profile per event, at random among thousands, and
//! each first touch missed the caches while the fold waited. The read phase has found the users of
//! the next events already, so the fold asks for their lines a few events early (experiments/055).

/// Asks the CPU to bring the cache line at `address` into its caches. Any address will do: this
/// changes nothing a program can observe but its speed. A no-op where the target has no such hint.
#[inline(always)]
pub fn prefetch_address(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 (SSE, baseline on x86_64) is a hint: it never faults, whatever the
    // address, and reads or writes nothing the program sees.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// [`prefetch_address`] of the line holding the start of `value`.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    prefetch_address((value as *const T).cast::<u8>());
}

/// [`prefetch_address`] of every cache line of `values`.
#[inline(always)]
pub fn prefetch_slice<T>(values: &[T]) {
    const LINE: usize = 64;
    let start = values.as_ptr().cast::<u8>();
    for offset in (0..std::mem::size_of_val(values)).step_by(LINE) {
        prefetch_address(start.wrapping_add(offset));
    }
}
