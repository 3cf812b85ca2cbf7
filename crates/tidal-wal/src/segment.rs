//! Segment files: naming (`<first seqno, 20 digits>.seg`), [`SegmentInfo`], the end mark the
//! writer leaves after its last batch, and the verifying scan that recovery runs over a segment's
//! bytes.
//!
//! Delicate: the scan is what decides between a torn tail (cut it and go on) and corruption
//! (refuse to open). Only the end of the LAST segment may be torn. The rule (decisions/058): a
//! batch that fails to verify is torn only if it cannot have been written completely; a batch
//! whose bytes were all written and still fail is corruption, wherever it is, the last batch of
//! the log included.
//!
//! Bytes alone cannot tell the two apart in a preallocated segment (decisions/017): a write that
//! stopped over zeros looks exactly like a complete batch ending in zero bytes with a bit flipped.
//! So the writer says where its writes ended: every write of batches into the active segment ends
//! with an [end mark](end_mark) right after the last batch (32 bytes, overwritten by the next
//! write, cut off by a rotation's seal and a clean shutdown, written again by an open). A write
//! that reached its end mark wrote every batch before it. The scan of a batch that fails:
//! - a verified batch or a valid end mark later in the file: corruption (the write went past it);
//! - a header that does not decode (or is not all there): torn iff nothing but zeros follows the
//!   64 header bytes;
//! - a header that decodes: torn iff the batch's bytes stop (only zeros after them, to the end of
//!   the file) before the end its header claims, or the claimed end lies past the end of the file;
//!   and not if the file ends exactly where the batch does (its every byte is in the file, and no
//!   writer wrote past it), nor if the batch verifies once its length field is taken to end at the
//!   end of the file (a damaged length field of a batch that a seal or a clean shutdown cut the
//!   file after).
//!
//! The logical end of a segment, where the next batch would start, holds zeros (preallocated) or
//! the end mark (or a prefix of it: a write torn inside its own mark), followed by zeros. If
//! anything else follows, in the last segment it is what is left of an unsynced write whose first
//! sector never reached the disk: a torn tail at that offset; in another segment, corruption. A
//! sealed segment is cut to its batches at rotation; should that cut not have reached the disk,
//! its mark and zeros are harmless (recovery checks that the next segment continues the seqnos,
//! and cuts them).
//!
//! Everything else that fails to verify is corruption.

use std::path::{Path, PathBuf};

use tidal_types::{Seqno, Term, TermSeqno};

use crate::batch::{decode_batch, decode_header, seals_as_whole, BatchHeader, HEADER_LEN, MAGIC};

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

/// Length of the end mark (decisions/058).
pub const END_MARK_LEN: usize = 32;
/// First bytes of an end mark. Its first byte differs from the batch magic's, so a batch written
/// over a mark changes the mark from its first byte on.
pub const END_MAGIC: [u8; 4] = *b"tdle";
/// Version of the end mark's layout.
const END_MARK_VERSION: u8 = 1;

/// The end mark the writer leaves right after the last batch of each write into the active
/// segment, at `offset` of the segment, for a log that continues at `next_seqno`:
///
/// ```text
/// offset size field
///      0    4 magic "tdle"
///      4    1 version (1)
///      5    3 zero
///      8    8 offset of the mark in its segment  u64 LE
///     16    8 next seqno of the log              u64 LE
///     24    4 zero
///     28    4 0xff
/// ```
///
/// Bytes 24..32 make sure a batch header torn over a mark never decodes: where the header holds
/// its event count the mark has zeros, where it holds its payload length, more than the largest
/// payload. Not part of any batch; readers and sealed segments never see it.
pub fn end_mark(offset: u64, next_seqno: Seqno) -> [u8; END_MARK_LEN] {
    let mut mark = [0u8; END_MARK_LEN];
    mark[0..4].copy_from_slice(&END_MAGIC);
    mark[4] = END_MARK_VERSION;
    mark[8..16].copy_from_slice(&offset.to_le_bytes());
    mark[16..24].copy_from_slice(&next_seqno.get().to_le_bytes());
    mark[28..32].copy_from_slice(&[0xff; 4]);
    mark
}

/// The next seqno an end mark at the start of `bytes` records, if a valid mark for `offset` is
/// there.
fn end_mark_at(bytes: &[u8], offset: u64) -> Option<Seqno> {
    let slot: [u8; 8] = bytes.get(16..24)?.try_into().ok()?;
    let next = Seqno(u64::from_le_bytes(slot));
    (bytes.get(..END_MARK_LEN)? == end_mark(offset, next)).then_some(next)
}

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
    /// First seqno and offset of every verified batch, in order (for the batch index).
    pub batch_starts: Vec<(Seqno, u64)>,
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
        batch_starts: Vec::new(),
        end: ScanEnd::Clean,
    };
    let mut offset = 0usize;
    while offset < bytes.len() {
        let rest = &bytes[offset..];
        let head = &rest[..rest.len().min(HEADER_LEN)];
        if is_logical_end(head, offset as u64, scan.next_seqno) {
            // Zeros (preallocated) or the end mark, where the next batch would start.
            if !is_zero(&rest[head.len()..]) {
                scan.end = if is_last {
                    ScanEnd::Torn { offset: offset as u64 }
                } else {
                    let reason = "bytes after the logical end of a segment that is not the last".to_string();
                    ScanEnd::Corrupt { offset: offset as u64, reason }
                };
            }
            return scan;
        }
        let batch = match decode_batch(rest) {
            Ok(batch) => batch,
            Err(err) => {
                let torn = !written_after(rest, offset as u64, scan.next_seqno) && stops_short(rest);
                scan.end = if torn && is_last {
                    ScanEnd::Torn { offset: offset as u64 }
                } else if torn {
                    let reason = format!("{err} in a segment that is not the last");
                    ScanEnd::Corrupt { offset: offset as u64, reason }
                } else {
                    ScanEnd::Corrupt {
                        offset: offset as u64,
                        reason: format!("{err} in a batch written whole"),
                    }
                };
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
        scan.batch_starts.push((header.first_seqno, offset as u64));
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

/// Whether the first (up to 64) bytes where the next batch would start are the logical end: the
/// end mark for this offset and seqno, or a prefix of it, and then only zeros (all zeros included).
fn is_logical_end(head: &[u8], offset: u64, next_seqno: Seqno) -> bool {
    let mark = end_mark(offset, next_seqno);
    let same = head.iter().zip(mark.iter()).take_while(|(byte, expected)| byte == expected).count();
    is_zero(&head[same..])
}

/// Whether the batch that fails to verify at the start of `rest` (its expected first seqno
/// `next_seqno`, at `offset` of its segment) can be a write that stopped short, judged from its own
/// bytes and the end of the file (see the module docs): its header is not all there or does not
/// decode, with only zeros after it; or its bytes stop, with only zeros after them, before the
/// end its header claims, or that end lies past the end of the file. Not if the file ends exactly
/// where the batch does, nor if the batch verifies once its length field is taken to end at the
/// end of the file.
fn stops_short(rest: &[u8]) -> bool {
    let header: BatchHeader = match decode_header(rest) {
        Ok(header) => header,
        Err(_) => return data_len(rest) <= HEADER_LEN,
    };
    let claimed = header.encoded_len();
    if claimed <= rest.len() && (rest.len() == claimed || data_len(rest) >= claimed) {
        // Every byte of it is in the file, and no zeros follow it to the end of the file that a
        // torn write would have left.
        return false;
    }
    !seals_as_whole(rest)
}

/// Whether anything written after the start of the failing batch at the start of `rest` (at
/// `offset` of its segment, its expected first seqno `next_seqno`) shows that the batch was written
/// whole: a verified batch of a later seqno, or a valid end mark for a later seqno, starting
/// anywhere in it or after it. A write is one run of bytes that ends in its mark, so either was
/// written after all of this batch's bytes.
fn written_after(rest: &[u8], offset: u64, next_seqno: Seqno) -> bool {
    let data = data_len(rest);
    (1..data.saturating_sub(3)).any(|at| {
        let bytes = &rest[at..];
        (bytes[..4] == MAGIC && decode_batch(bytes).is_ok_and(|later| later.header.first_seqno > next_seqno))
            || (bytes[..4] == END_MAGIC
                && end_mark_at(bytes, offset + at as u64).is_some_and(|next| next > next_seqno))
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

    /// Two batches, the second ending in eight zero bytes, and what the writer leaves after them.
    fn ending_in_zeros() -> (Vec<u8>, usize) {
        let mut bytes = encode_batch(RecordKind::Signal, Term(1), Seqno(5), 3, &[7u8; 20]);
        let second = bytes.len();
        let mut payload = 1_000u64.to_le_bytes().to_vec();
        payload.extend(42u64.to_le_bytes());
        bytes.extend(encode_batch(RecordKind::ItemDelete, Term(2), Seqno(8), 1, &payload));
        (bytes, second)
    }

    #[test]
    fn the_end_mark_and_any_prefix_of_it_are_the_logical_end() {
        let (whole, _) = ending_in_zeros();
        let mark = end_mark(whole.len() as u64, Seqno(9));
        for len in 0..=END_MARK_LEN {
            for zeros in [0, 1, 100] {
                let mut bytes = whole.clone();
                bytes.extend(&mark[..len]);
                bytes.resize(bytes.len() + zeros, 0);
                for is_last in [true, false] {
                    let scan = scan_segment(&bytes, Seqno(5), Term(0), is_last);
                    assert_eq!(
                        (scan.end, scan.valid_len),
                        (ScanEnd::Clean, whole.len() as u64),
                        "{len} {zeros}"
                    );
                }
            }
        }
        // A mark for another place or another seqno is not the end; nor is anything after a mark.
        for other in [end_mark(whole.len() as u64 + 1, Seqno(9)), end_mark(whole.len() as u64, Seqno(10))] {
            let mut bytes = whole.clone();
            bytes.extend(other);
            assert!(matches!(scan_segment(&bytes, Seqno(5), Term(0), true).end, ScanEnd::Torn { .. }));
        }
        let mut bytes = whole.clone();
        bytes.extend(mark);
        bytes.resize(bytes.len() + 100, 0);
        bytes.push(1);
        let offset = whole.len() as u64;
        assert_eq!(scan_segment(&bytes, Seqno(5), Term(0), true).end, ScanEnd::Torn { offset });
        assert!(matches!(scan_segment(&bytes, Seqno(5), Term(0), false).end, ScanEnd::Corrupt { .. }));
    }

    #[test]
    fn a_last_batch_written_whole_that_fails_is_corruption_whatever_it_ends_in() {
        let (whole, second) = ending_in_zeros();
        let with_mark = |bytes: &[u8], zeros: usize| {
            let mut bytes = bytes.to_vec();
            bytes.extend(end_mark(whole.len() as u64, Seqno(9)));
            bytes.resize(bytes.len() + zeros, 0);
            bytes
        };
        for bit in second * 8..whole.len() * 8 {
            let mut flipped = whole.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            // Followed by its end mark (with or without preallocated zeros), or cut right after it.
            for bytes in [with_mark(&flipped, 0), with_mark(&flipped, 4096), flipped.clone()] {
                let end = scan_segment(&bytes, Seqno(5), Term(0), true).end;
                assert!(
                    matches!(end, ScanEnd::Corrupt { offset, .. } if offset == second as u64),
                    "bit {bit}: {end:?}"
                );
            }
        }
    }

    #[test]
    fn a_write_torn_over_an_end_mark_is_torn() {
        let (whole, second) = ending_in_zeros();
        let old_mark = end_mark(second as u64, Seqno(8));
        for keep in 1..whole.len() - second {
            for zeros in [0usize, 4096] {
                let mut bytes = whole[..second].to_vec();
                bytes.extend(old_mark);
                bytes.resize(bytes.len() + zeros, 0);
                let reach = (second + keep).max(bytes.len());
                bytes.resize(reach, 0);
                bytes[second..second + keep].copy_from_slice(&whole[second..second + keep]);
                let scan = scan_segment(&bytes, Seqno(5), Term(0), true);
                let expected = if keep >= whole.len() - second - 7 && zeros > 0 {
                    // Only the batch's own trailing zeros were not written: the preallocated ones
                    // are the same bytes, and the batch is whole.
                    ScanEnd::Clean
                } else {
                    ScanEnd::Torn { offset: second as u64 }
                };
                assert_eq!(scan.end, expected, "keep {keep} zeros {zeros}");
            }
        }
    }

    #[test]
    fn a_damaged_length_field_of_a_last_batch_is_corruption() {
        let (whole, second) = ending_in_zeros();
        for bit in 0..32 {
            let mut bytes = whole.clone();
            bytes[second + 28 + bit / 8] ^= 1 << (bit % 8);
            let end = scan_segment(&bytes, Seqno(5), Term(0), true).end;
            assert!(
                matches!(end, ScanEnd::Corrupt { offset, .. } if offset == second as u64),
                "bit {bit}: {end:?}"
            );
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
