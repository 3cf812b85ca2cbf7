//! The cluster secret on every inter-node call: `authorization: Bearer <secret>` metadata, checked
//! in constant time by an interceptor. There are no unauthenticated inter-node RPCs.

use tonic::{Request, Status};

/// Constant-time comparison: the time taken does not depend on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A tonic interceptor that admits only calls carrying the cluster secret.
#[derive(Clone)]
pub struct SecretCheck {
    expected: String,
}

impl SecretCheck {
    /// Checks for `secret`.
    pub fn new(secret: &str) -> SecretCheck {
        SecretCheck { expected: format!("Bearer {secret}") }
    }

    /// Whether `presented` is the `authorization` value a call with the secret carries (constant
    /// time).
    pub fn matches(&self, presented: &[u8]) -> bool {
        constant_time_eq(presented, self.expected.as_bytes())
    }

    /// The interceptor body.
    pub fn check<T>(&self, request: Request<T>) -> Result<Request<T>, Status> {
        let presented =
            request.metadata().get("authorization").map(|value| value.as_bytes()).unwrap_or_default();
        if self.matches(presented) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong cluster secret"))
        }
    }
}

/// Adds the cluster secret to outgoing calls.
#[derive(Clone)]
pub struct SecretAttach {
    value: tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
}

impl SecretAttach {
    /// Attaches `secret`; fails if it is not visible ASCII.
    pub fn new(secret: &str) -> Result<SecretAttach, Status> {
        let value = format!("Bearer {secret}")
            .parse()
            .map_err(|_| Status::invalid_argument("cluster secret must be visible ASCII"))?;
        Ok(SecretAttach { value })
    }

    /// The interceptor body.
    pub fn attach<T>(&self, mut request: Request<T>) -> Result<Request<T>, Status> {
        request.metadata_mut().insert("authorization", self.value.clone());
        Ok(request)
    }
}

impl tonic::service::Interceptor for SecretAttach {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.attach(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_is_admitted() {
        let check = SecretCheck::new("s3cret-s3cret");
        let attach = SecretAttach::new("s3cret-s3cret").unwrap();
        assert!(check.check(attach.attach(Request::new(())).unwrap()).is_ok());
        let wrong = SecretAttach::new("other").unwrap();
        assert_eq!(
            check.check(wrong.attach(Request::new(())).unwrap()).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(check.check(Request::new(())).is_err());
    }
}
