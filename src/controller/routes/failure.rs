//! How a downlink error becomes the [`WorkerFailure`] an error answer names: the controller's
//! half of [`crate::web::error`], which knows no service.

use crate::controller::DownlinkError;
use crate::web::error::{FailureKind, WorkerFailure};

impl WorkerFailure {
    /// Classifies a downlink error.
    pub fn from_downlink(
        instance_id: &str,
        worker_id: i64,
        endpoint: &str,
        error: &DownlinkError,
    ) -> Self {
        let kind = match error {
            DownlinkError::Timeout(_) => FailureKind::Timeout,
            DownlinkError::Busy => FailureKind::Busy,
            DownlinkError::Decode(_) => FailureKind::Undecodable,
            DownlinkError::Transport(_) | DownlinkError::Closed => FailureKind::Unreachable,
        };
        let message = match error {
            // The downlink reports the time left before the deadline (e.g. 4.99995s): round.
            DownlinkError::Timeout(d) => format!(
                "worker did not answer within {:?}",
                std::time::Duration::from_millis(d.as_secs_f64().mul_add(1000.0, 0.5) as u64)
            ),
            other => other.to_string(),
        };
        WorkerFailure {
            instance_id: instance_id.to_owned(),
            worker_id,
            endpoint: endpoint.to_owned(),
            kind,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::controller::DownlinkError;
    use crate::web::error::{FailureKind, WorkerFailure};
    use std::time::Duration;

    fn failure(kind: DownlinkError) -> WorkerFailure {
        WorkerFailure::from_downlink("inst", 1, "127.0.0.1:9", &kind)
    }

    #[test]
    fn downlink_errors_are_classified() {
        let kinds = [
            DownlinkError::Timeout(Duration::from_millis(500)),
            DownlinkError::Busy,
            DownlinkError::Closed,
        ]
        .map(|e| failure(e).kind);
        assert_eq!(
            kinds,
            [
                FailureKind::Timeout,
                FailureKind::Busy,
                FailureKind::Unreachable
            ]
        );
        let nearly = failure(DownlinkError::Timeout(Duration::from_nanos(4_999_954_026)));
        assert_eq!(nearly.message, "worker did not answer within 5s");
    }
}
