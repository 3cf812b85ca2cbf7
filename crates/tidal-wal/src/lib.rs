//! Tidal's write-ahead log.
#![deny(missing_docs)]

pub mod batch;

pub use batch::{
    decode_batch, decode_header, encode_batch, Batch, BatchHeader, BatchRef, DecodeError, HEADER_LEN,
};
