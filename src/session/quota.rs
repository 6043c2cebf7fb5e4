//! Per-user limits on making sessions: how many one user may keep, and how fast one user may
//! make new ones (open or fork), so that one user cannot fill the server's memory and disk.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::{Caller, SessionError};
use crate::store::Store;

/// One user's allowance of new sessions: a bucket that refills at the per-minute rate.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The limits, and each user's bucket.
#[derive(Debug)]
pub(crate) struct SessionQuota {
    max_stored: u64,
    per_minute: u32,
    buckets: Mutex<HashMap<Option<String>, Bucket>>,
}

impl SessionQuota {
    /// `max_stored` sessions per user and `per_minute` new ones a minute; 0 lifts either.
    pub(crate) fn new(max_stored: u64, per_minute: u32) -> Self {
        Self {
            max_stored,
            per_minute,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Lets `caller` make one more session, or says which limit refuses it.
    pub(crate) async fn admit(
        &self,
        caller: &Caller,
        store: &dyn Store,
    ) -> Result<(), SessionError> {
        self.take_token(caller, Instant::now())?;
        if self.max_stored > 0 {
            let stored = store.count_sessions(caller.user.as_deref()).await?;
            if stored >= 0 && stored as u64 >= self.max_stored {
                return Err(SessionError::QuotaExceeded(format!(
                    "this user already has {stored} sessions, the most server.max_sessions_per_user \
                     ({}) allows; delete some first",
                    self.max_stored
                )));
            }
        }
        Ok(())
    }

    fn take_token(&self, caller: &Caller, now: Instant) -> Result<(), SessionError> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_second = capacity / 60.0;
        // A panic while holding it leaves buckets that are still whole.
        let mut buckets = crate::mutex::lock(&self.buckets);
        let bucket = buckets.entry(caller.user.clone()).or_insert(Bucket {
            tokens: capacity,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(capacity);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            let wait = ((1.0 - bucket.tokens) / per_second).ceil();
            return Err(SessionError::QuotaExceeded(format!(
                "this user made {} new sessions within a minute, the most \
                 server.session_creates_per_minute allows; retry in {wait} s",
                self.per_minute
            )));
        }
        bucket.tokens -= 1.0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn user(name: &str) -> Caller {
        Caller {
            user: Some(name.to_string()),
        }
    }

    #[test]
    fn a_user_may_make_a_minutes_worth_at_once_then_at_the_rate() {
        let quota = SessionQuota::new(0, 60);
        let start = Instant::now();
        for _ in 0..60 {
            quota.take_token(&user("alice"), start).unwrap();
        }
        let refused = quota.take_token(&user("alice"), start).unwrap_err();
        assert_eq!(refused.kind(), "quota_exceeded");
        assert!(
            refused.to_string().contains("session_creates_per_minute"),
            "{refused}"
        );
        // Another user has an allowance of their own.
        quota.take_token(&user("bob"), start).unwrap();
        // One a second comes back.
        quota
            .take_token(&user("alice"), start + Duration::from_millis(1100))
            .unwrap();
        assert!(
            quota
                .take_token(&user("alice"), start + Duration::from_millis(1200))
                .is_err()
        );
    }

    #[test]
    fn zero_lifts_the_rate() {
        let quota = SessionQuota::new(0, 0);
        let now = Instant::now();
        for _ in 0..10_000 {
            quota.take_token(&user("alice"), now).unwrap();
        }
    }
}
