//! Serving with a clean stop: on SIGTERM (or ctrl-c) stop accepting connections and new
//! generations, let running streams finish for up to a grace period, then return.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::{router, AppState};

/// Resolves on SIGTERM or ctrl-c (SIGINT).
pub async fn termination_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Serves `state` on `listener` until `stop` resolves, then drains for at most `grace`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    stop: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let (stopping_tx, mut stopping_rx) = watch::channel(false);
    let app = router(state.clone());
    let stop_state = state.clone();
    tokio::spawn(async move {
        stop.await;
        tracing::info!(
            "stopping: refusing new requests, letting running streams finish (grace {:.0}s)",
            grace.as_secs_f64()
        );
        stop_state.begin_shutdown();
        let _ = stopping_tx.send(true);
    });
    let mut graceful_rx = stopping_rx.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = graceful_rx.wait_for(|&s| s).await;
    });
    let deadline = async move {
        let _ = stopping_rx.wait_for(|&s| s).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = server => {
            tracing::info!("all connections closed; exiting");
            r
        }
        _ = deadline => {
            tracing::warn!("grace period over with streams still open; exiting");
            Ok(())
        }
    }
}
