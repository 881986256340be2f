//! [`run_as_task`]: a future that runs as a tokio task of its own, yet stops with its caller.
//!
//! `vmop run` drives the controllers from `main`, whose future `block_on` polls on the main
//! thread, outside the runtime's workers: every reply the HTTP connection tasks read on a
//! worker then had to wake the main thread, a futex wake and a context switch per request.
//! As tasks, the controllers run on the workers next to the connections that wake them
//! (operator CPU 0.77× at create, 0.93× at delete in `bench/run.sh`, N=1000, two rounds).

use std::future::Future;

use tokio::task::JoinHandle;

/// Aborts the task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `work` as a task and completes with it. Dropping the returned future aborts the task,
/// as dropping `work` itself would have stopped it: a leader that loses its Lease drops the
/// controllers, which must not go on reconciling (test: `tests::dropping_the_future_aborts_the_task`).
/// A panic in `work` resumes in the caller.
pub async fn run_as_task<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    let mut task = AbortOnDrop(tokio::spawn(work));
    match (&mut task.0).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: only dropping this future aborts the task, or the runtime shutting down,
        // which drops this future too.
        Err(_) => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn completes_with_the_task() {
        assert_eq!(run_as_task(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn dropping_the_future_aborts_the_task() {
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        let (alive, mut ended) = tokio::sync::mpsc::channel::<()>(1);
        let work = run_as_task(async move {
            let _alive = alive;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        let mut work = Box::pin(work);
        tokio::select! {
            () = &mut work => unreachable!("the work never completes"),
            _ = started => {}
        }
        drop(work);
        // The task drops its sender when it is aborted: `recv` ends instead of waiting forever.
        assert_eq!(ended.recv().await, None);
    }

    #[tokio::test]
    #[should_panic(expected = "boom")]
    async fn a_panic_resumes_in_the_caller() {
        run_as_task(async { panic!("boom") }).await;
    }
}
