//! openraft's async runtime: tokio, with a random source a simulation can seed.
//!
//! openraft draws its election timeouts from `AsyncRuntime::thread_rng()`. With openraft's own
//! `TokioRuntime` that is `rand::thread_rng()`, seeded by the OS, so a simulated cluster elected a
//! different first leader on every replay of one seed (decisions/051). [`TidalRuntime`] is tokio
//! in everything else; its random source is the OS-seeded thread RNG unless the thread has been
//! given a seed with [`seed_thread_rng`], as the simulation does for the one thread that runs every
//! simulated host. The campaign spreader ([`super::campaign`]) draws from the same source.

use openraft::{AsyncRuntime, OptionalSend, TokioRuntime};
use rand::{RngCore, SeedableRng};
use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

thread_local! {
    static SEEDED: RefCell<Option<rand::rngs::StdRng>> = const { RefCell::new(None) };
}

/// From now on this thread's control-plane draws (openraft's election timeouts, the campaign
/// pauses) come from a generator seeded with `seed`: the same seed, the same draws. `None` returns
/// the thread to the OS-seeded generator.
pub fn seed_thread_rng(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// A draw from [`ControlRng`]: from the seed on a thread given one (the simulation), else from the
/// OS-seeded thread generator.
pub fn random_u64() -> u64 {
    ControlRng.next_u64()
}

/// The control plane's random source: the thread's seeded generator if it has one, else
/// `rand::thread_rng()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlRng;

impl ControlRng {
    fn with<T>(draw: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(rng) => draw(rng),
            None => draw(&mut rand::thread_rng()),
        })
    }
}

impl RngCore for ControlRng {
    fn next_u32(&mut self) -> u32 {
        ControlRng::with(|rng| rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        ControlRng::with(|rng| rng.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        ControlRng::with(|rng| rng.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        ControlRng::with(|rng| rng.try_fill_bytes(dest))
    }
}

/// tokio, as openraft's `TokioRuntime`, with [`ControlRng`] as its random source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TidalRuntime;

impl AsyncRuntime for TidalRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = <TokioRuntime as AsyncRuntime>::Instant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ControlRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ControlRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn a_seeded_thread_draws_the_same_sequence_and_an_unseeded_one_does_not_repeat_it() {
        let draws = |seed: Option<u64>| {
            seed_thread_rng(seed);
            let drawn: Vec<u64> = (0..16).map(|_| TidalRuntime::thread_rng().gen_range(150..300)).collect();
            seed_thread_rng(None);
            drawn
        };
        assert_eq!(draws(Some(7)), draws(Some(7)));
        assert_ne!(draws(Some(7)), draws(Some(8)));
        // OS-seeded: 16 draws in [150, 300) repeating by chance has odds of about 150^-16.
        assert_ne!(draws(None), draws(None));
    }
}
