//! Segment files: naming (`<first seqno, 20 digits>.seg`), [`SegmentInfo`], and the verifying scan
//! that recovery runs over a segment's bytes.
//!
//! Delicate: the scan is what decides between a torn tail (truncate and go on) and corruption (refuse
//! to open). Only the end of the LAST segment may be torn; an "incomplete" batch that is followed by
//! a later valid batch is a damaged length field, not a torn write, and is corruption.
//!
//! The last segment may be preallocated (decisions/017): written with zeros before use, then
//! overwritten in place. So:
//! - an all-zero header where the next batch would start is the logical end. If only zeros follow,
//!   the scan is clean, in any segment (a sealed segment is cut to its batches at rotation; should
//!   that cut not have reached the disk, its zeros are harmless: recovery checks that the next
//!   segment continues the seqnos, and cuts them). If anything else follows, in the last segment it
//!   is what is left of an unsynced write whose first sector never reached the disk: a torn tail at
//!   that offset; in another segment, corruption.
//! - a batch that fails to verify is a torn write if its bytes stop (everything after them zero)
//!   before the end its header claims (or, with an unreadable header, within the header): the
//!   write was cut short over zeros. A batch whose bytes all are there and still fail is corruption.
//!   (So a flipped bit in the last batch of the log reads as torn if that batch's payload happens to
//!   end in zero bytes; as a grown length field already did.)
//!
//! Everything else that fails to verify is corruption.

use std::path::{Path, PathBuf};

use tidal_types::{Seqno, Term, TermSeqno};

use crate::batch::{decode_batch, decode_header, DecodeError, HEADER_LEN, MAGIC};

/// Suffix of segment file names.
pub const SEGMENT_SUFFIX: &str = ".seg";
/// The next segment while it is prepared (zeros written and fsynced); a rotation renames it to the
/// segment's name. Recovery removes it.
pub const PREP_FILE_NAME: &str = "segment.prep";
/// A prepared next segment a clean shutdown kept: every byte of it written with zeros and fsynced
/// before the rename that gave it this name, so an open trusts it without reading it, and a
/// restart takes it as its active segment instead of writing zeros (decisions/033).
pub const READY_FILE_NAME: &str = "segment.ready";
/// Digits of the zero-padded first seqno in a segment file name (u64::MAX has 20).
const SEGMENT_NAME_DIGITS: usize = 20;

/// One segment file as the WAL knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// The file.
    pub path: PathBuf,
    /// Seqno of its first batch (the file name).
    pub first_seqno: Seqno,
    /// Last durable seqno in it; `None` while it holds no batch.
    pub last_seqno: Option<Seqno>,
    /// Durable length in bytes.
    pub bytes: u64,
}

/// The file name of the segment whose first seqno is `first`.
pub fn segment_file_name(first: Seqno) -> String {
    format!("{:0width$}{SEGMENT_SUFFIX}", first.0, width = SEGMENT_NAME_DIGITS)
}

/// The first seqno a segment file name carries, or `None` if the path is not a segment.
pub fn parse_segment_file_name(path: &Path) -> Option<Seqno> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Seqno)
}

/// How a segment scan ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// Every byte belongs to a whole, verified batch.
    Clean,
    /// A torn tail starts at `offset` (only reported when scanning the last segment).
    Torn {
        /// Where the torn bytes start.
        offset: u64,
    },
    /// Damage at `offset`.
    Corrupt {
        /// Where the bad batch starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// What a scan of one segment's bytes found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    /// Whole verified batches before the end.
    pub batches: u64,
    /// Bytes of those batches.
    pub valid_len: u64,
    /// Seqno after the last verified batch.
    pub next_seqno: Seqno,
    /// Term of the last verified batch (the `term` passed in if none).
    pub last_term: Term,
    /// Term of the first verified batch, if any.
    pub first_term: Option<Term>,
    /// Logged time of the last verified batch, if any.
    pub last_time_ms: Option<u64>,
    /// First position of every term met that is above the `term` passed in, in order.
    pub term_starts: Vec<TermSeqno>,
    /// First seqno of every verified batch, in order (for the batch index).
    pub batch_firsts: Vec<Seqno>,
    /// How the scan ended.
    pub end: ScanEnd,
}

/// Scans `bytes` as a segment whose first batch must start at `next_seqno` and whose terms may not
/// go below `term`. Never panics, whatever the bytes. With `is_last`, a torn tail ends the scan as
/// [`ScanEnd::Torn`]; otherwise it is corruption.
pub fn scan_segment(bytes: &[u8], next_seqno: Seqno, term: Term, is_last: bool) -> SegmentScan {
    let mut scan = SegmentScan {
        batches: 0,
        valid_len: 0,
        next_seqno,
        last_term: term,
        first_term: None,
        last_time_ms: None,
        term_starts: Vec::new(),
        batch_firsts: Vec::new(),
        end: ScanEnd::Clean,
    };
    let mut offset = 0usize;
    while offset < bytes.len() {
        let rest = &bytes[offset..];
        if is_zero(&rest[..rest.len().min(HEADER_LEN)]) {
            // The logical end of a preallocated segment.
            if !is_zero(rest) {
                scan.end = if is_last {
                    ScanEnd::Torn { offset: offset as u64 }
                } else {
                    let reason = "bytes after a zero header in a segment that is not the last".to_string();
                    ScanEnd::Corrupt { offset: offset as u64, reason }
                };
            }
            return scan;
        }
        let batch = match decode_batch(rest) {
            Ok(batch) => batch,
            Err(err) => {
                scan.end = classify_failure(rest, &err, offset as u64, is_last);
                return scan;
            }
        };
        let header = batch.header;
        if header.first_seqno != scan.next_seqno {
            let reason =
                format!("batch starts at seqno {}, expected {}", header.first_seqno, scan.next_seqno);
            scan.end = ScanEnd::Corrupt { offset: offset as u64, reason };
            return scan;
        }
        if header.term < scan.last_term {
            let reason = format!("batch term {} is below the previous term {}", header.term, scan.last_term);
            scan.end = ScanEnd::Corrupt { offset: offset as u64, reason };
            return scan;
        }
        if header.term > scan.last_term {
            scan.term_starts.push(TermSeqno { term: header.term, seqno: header.first_seqno });
        }
        scan.last_term = header.term;
        scan.first_term.get_or_insert(header.term);
        scan.batch_firsts.push(header.first_seqno);
        scan.last_time_ms = logged_time_ms(batch.payload).or(scan.last_time_ms);
        scan.next_seqno = header.last_seqno().next();
        scan.batches += 1;
        offset += batch.encoded.len();
        scan.valid_len = offset as u64;
    }
    scan
}

/// The logged time in a payload's envelope (its first 8 bytes, u64 LE), if it has one.
pub fn logged_time_ms(payload: &[u8]) -> Option<u64> {
    let slot: [u8; 8] = payload.get(0..8)?.try_into().ok()?;
    Some(u64::from_le_bytes(slot))
}

/// Whether every byte is zero.
pub fn is_zero(bytes: &[u8]) -> bool {
    // Word-sized steps: a recovery may check a preallocated segment's tens of MiB of zeros.
    let (words, tail) = bytes.split_at(bytes.len() / 8 * 8);
    words.chunks_exact(8).all(|word| word == [0u8; 8]) && tail.iter().all(|byte| *byte == 0)
}

/// Length of `bytes` without its trailing zeros.
pub fn data_len(bytes: &[u8]) -> usize {
    let mut end = bytes.len();
    while end >= 8 && bytes[end - 8..end] == [0u8; 8] {
        end -= 8;
    }
    bytes[..end].iter().rposition(|byte| *byte != 0).map_or(0, |at| at + 1)
}

fn classify_failure(rest: &[u8], err: &DecodeError, offset: u64, is_last: bool) -> ScanEnd {
    let torn = match err {
        DecodeError::Truncated { .. } => !followed_by_later_batch(rest),
        _ => cut_over_zeros(rest),
    };
    if torn && is_last {
        ScanEnd::Torn { offset }
    } else if torn {
        ScanEnd::Corrupt { offset, reason: format!("{err} in a segment that is not the last") }
    } else {
        ScanEnd::Corrupt { offset, reason: err.to_string() }
    }
}

/// Whether the batch at the start of `rest` stops short, over zeros: its last non-zero byte lies
/// before the end its header claims (within the header if the header does not decode).
fn cut_over_zeros(rest: &[u8]) -> bool {
    let data = data_len(rest);
    match decode_header(rest) {
        Ok(header) => data < header.encoded_len(),
        Err(_) => data <= HEADER_LEN,
    }
}

/// Whether a verified batch with a later first seqno starts anywhere inside `rest`, whose own header
/// claims to run past the end: then that claim is a damaged length, not a torn write.
fn followed_by_later_batch(rest: &[u8]) -> bool {
    let Ok(header) = decode_header(rest) else {
        return false;
    };
    (1..rest.len().saturating_sub(3)).any(|at| {
        rest[at..at + 4] == MAGIC
            && decode_batch(&rest[at..]).is_ok_and(|later| later.header.first_seqno > header.first_seqno)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::encode_batch;
    use tidal_types::RecordKind;

    fn two_batches() -> Vec<u8> {
        let mut bytes = encode_batch(RecordKind::Signal, Term(1), Seqno(5), 3, &[7u8; 20]);
        bytes.extend(encode_batch(RecordKind::Control, Term(2), Seqno(8), 1, &[9u8; 12]));
        bytes
    }

    #[test]
    fn names_round_trip_and_strangers_are_not_segments() {
        let name = segment_file_name(Seqno(42));
        assert_eq!(name, "00000000000000000042.seg");
        assert_eq!(parse_segment_file_name(Path::new(&name)), Some(Seqno(42)));
        assert_eq!(parse_segment_file_name(Path::new("42.seg")), None);
        assert_eq!(parse_segment_file_name(Path::new("wal.meta")), None);
        assert_eq!(parse_segment_file_name(Path::new("0000000000000000004x.seg")), None);
    }

    #[test]
    fn clean_scan_reports_terms_and_frontier() {
        let scan = scan_segment(&two_batches(), Seqno(5), Term(0), true);
        assert_eq!(scan.end, ScanEnd::Clean);
        assert_eq!(scan.batches, 2);
        assert_eq!(scan.next_seqno, Seqno(9));
        assert_eq!(scan.last_term, Term(2));
        assert_eq!(
            scan.term_starts,
            vec![TermSeqno { term: Term(1), seqno: Seqno(5) }, TermSeqno { term: Term(2), seqno: Seqno(8) }]
        );
    }

    #[test]
    fn a_gap_and_a_lower_term_are_corruption() {
        assert!(matches!(scan_segment(&two_batches(), Seqno(4), Term(0), true).end, ScanEnd::Corrupt { .. }));
        assert!(matches!(scan_segment(&two_batches(), Seqno(5), Term(3), true).end, ScanEnd::Corrupt { .. }));
    }

    #[test]
    fn torn_tails_only_in_the_last_segment() {
        let bytes = two_batches();
        let cut = &bytes[..bytes.len() - 1];
        assert_eq!(scan_segment(cut, Seqno(5), Term(0), true).end, ScanEnd::Torn { offset: 84 });
        assert!(matches!(scan_segment(cut, Seqno(5), Term(0), false).end, ScanEnd::Corrupt { .. }));
        let mut zeros = bytes.clone();
        zeros.extend([0u8; 100]);
        let scan = scan_segment(&zeros, Seqno(5), Term(0), false);
        assert_eq!((scan.end, scan.valid_len), (ScanEnd::Clean, 160), "zeros a seal did not cut");
        zeros[200] = 1;
        assert!(matches!(
            scan_segment(&zeros, Seqno(5), Term(0), false).end,
            ScanEnd::Corrupt { offset: 160, .. }
        ));
    }

    #[test]
    fn zeros_after_the_last_batch_are_the_logical_end_of_the_last_segment() {
        let mut bytes = two_batches();
        bytes.resize(4 << 20, 0);
        let scan = scan_segment(&bytes, Seqno(5), Term(0), true);
        assert_eq!((scan.end, scan.batches, scan.valid_len), (ScanEnd::Clean, 2, 160));
        let scan = scan_segment(&vec![0u8; 1 << 20], Seqno(5), Term(0), true);
        assert_eq!((scan.end, scan.batches, scan.valid_len), (ScanEnd::Clean, 0, 0));
        // Something after the zero header: the rest of an unsynced write; torn at the logical end.
        bytes[3 << 20] = 1;
        assert_eq!(scan_segment(&bytes, Seqno(5), Term(0), true).end, ScanEnd::Torn { offset: 160 });
    }

    #[test]
    fn a_batch_cut_short_over_zeros_is_torn_and_a_whole_damaged_one_is_corrupt() {
        let whole = two_batches();
        for cut in 85..whole.len() {
            let mut bytes = whole[..cut].to_vec();
            bytes.resize(whole.len() + 4096, 0);
            assert_eq!(
                scan_segment(&bytes, Seqno(5), Term(0), true).end,
                ScanEnd::Torn { offset: 84 },
                "cut {cut}"
            );
        }
        let mut flipped = whole.clone();
        flipped[84 + 70] ^= 4; // inside the last batch's payload, whose last byte is not zero
        flipped.resize(whole.len() + 4096, 0);
        assert!(matches!(
            scan_segment(&flipped, Seqno(5), Term(0), true).end,
            ScanEnd::Corrupt { offset: 84, .. }
        ));
    }

    #[test]
    fn zero_helpers_agree_with_a_byte_loop() {
        for len in 0..40 {
            for at in 0..=len {
                let mut bytes = vec![0u8; len];
                if at < len {
                    bytes[at] = 9;
                }
                assert_eq!(is_zero(&bytes), bytes.iter().all(|byte| *byte == 0));
                assert_eq!(data_len(&bytes), if at < len { at + 1 } else { 0 });
            }
        }
    }

    #[test]
    fn a_grown_length_field_before_a_valid_batch_is_corruption() {
        let mut bytes = two_batches();
        bytes[28 + 2] ^= 1; // payload_len of the first batch grows past the end of the file
        assert!(matches!(
            scan_segment(&bytes, Seqno(5), Term(0), true).end,
            ScanEnd::Corrupt { offset: 0, .. }
        ));
    }
}
