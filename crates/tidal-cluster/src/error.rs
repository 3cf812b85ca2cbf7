//! Errors of this crate's operator requests.

/// Why an operator request (a membership change, a leadership transfer) was not carried out. The
/// two cases map to the two answers an operator acts on differently: fix the request, or retry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The request cannot succeed as asked (e.g. the target is not a voter, or not a member).
    Invalid(String),
    /// Not now: this node does not lead, another change runs, a learner is still catching up, the
    /// target is silent, or the attempt failed; retry.
    Unavailable(String),
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Invalid(why) | RequestError::Unavailable(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RequestError {}
