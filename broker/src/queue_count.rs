//! The broker's bound on how many queues it holds (`mqd --max-queues`).

use crate::error::BrokerError;

/// Refuses one more queue when `held` (subqueues included) already reaches `max`.
pub(crate) fn check(held: usize, max: usize) -> Result<(), BrokerError> {
    if held >= max {
        return Err(BrokerError::QuotaExceeded(format!(
            "this broker holds {held} queues; the limit is {max} (mqd --max-queues); delete one first"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn refuses_at_the_limit_and_names_the_flag() {
        assert!(super::check(9, 10).is_ok());
        let e = super::check(10, 10).unwrap_err().to_string();
        assert!(e.contains("--max-queues") && e.contains("10"), "{e}");
    }
}
