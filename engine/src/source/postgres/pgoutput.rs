//! The messages of Postgres's `pgoutput` plugin (protocol version 1) that a
//! change stream carries between a transaction's Begin and Commit, which
//! `pgwire-replication` hands over undecoded: relations (a table's columns,
//! sent before its first change and again after it changed), inserts,
//! updates, deletes and truncates, each tuple's values in text form.

use std::fmt;

/// A WAL position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Parses Postgres's `X/Y` form.
    pub fn parse(s: &str) -> Option<Lsn> {
        let (hi, lo) = s.split_once('/')?;
        let hi = u64::from_str_radix(hi, 16).ok()?;
        let lo = u64::from_str_radix(lo, 16).ok()?;
        if hi > u64::from(u32::MAX) || lo > u64::from(u32::MAX) {
            return None;
        }
        Some(Lsn((hi << 32) | lo))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

/// A column of a relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelColumn {
    pub name: String,
    pub type_oid: u32,
    pub typmod: i32,
    /// Part of the replica identity.
    pub key: bool,
}

/// One value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the update did not change, which pgoutput leaves out.
    Unchanged,
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Relation {
        id: u32,
        namespace: String,
        name: String,
        columns: Vec<RelColumn>,
        /// Its replica identity is FULL: a delete's and an update's old
        /// tuple is the whole row.
        full: bool,
    },
    Insert {
        rel: u32,
        new: Vec<Value>,
    },
    /// `old`: the old key (or the whole old row under `REPLICA IDENTITY
    /// FULL`) when the key changed or the identity is full.
    Update {
        rel: u32,
        old: Option<Vec<Value>>,
        new: Vec<Value>,
    },
    Delete {
        rel: u32,
        old: Vec<Value>,
    },
    Truncate {
        rels: Vec<u32>,
    },
    /// Begin, commit, origin, type and message records, which the stream's
    /// reader learns of elsewhere or does not need.
    Other(u8),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pgoutput message '{tag}': {reason}")]
pub struct DecodeError {
    pub tag: char,
    pub reason: String,
}

struct Cursor<'a> {
    tag: u8,
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn err(&self, reason: impl Into<String>) -> DecodeError {
        DecodeError {
            tag: char::from(self.tag),
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(self.err(format!(
                "truncated: {n} bytes wanted, {} left",
                self.b.len()
            )));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn cstring(&mut self) -> Result<String, DecodeError> {
        let end = self
            .b
            .iter()
            .position(|&c| c == 0)
            .ok_or_else(|| self.err("a name without its terminating zero"))?;
        let s = std::str::from_utf8(&self.b[..end])
            .map_err(|e| self.err(format!("a name that is not UTF-8: {e}")))?
            .to_string();
        self.b = &self.b[end + 1..];
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let n = self.i16()?;
        let mut out = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len)
                        .map_err(|_| self.err(format!("a value of length {len}")))?;
                    let v = self.take(len)?;
                    Value::Text(
                        String::from_utf8(v.to_vec()).map_err(|e| {
                            self.err(format!("a text value that is not UTF-8: {e}"))
                        })?,
                    )
                }
                b'b' => return Err(self.err("a binary value (the stream asked for text)")),
                other => {
                    return Err(self.err(format!("unknown tuple value kind {other:#04x}")));
                }
            });
        }
        Ok(out)
    }
}

/// Decodes one message of a change stream.
pub fn decode(data: &[u8]) -> Result<Message, DecodeError> {
    let Some((&tag, body)) = data.split_first() else {
        return Err(DecodeError {
            tag: '?',
            reason: "an empty message".into(),
        });
    };
    let mut c = Cursor { tag, b: body };
    let rel = |c: &mut Cursor<'_>| c.i32().map(|r| r as u32);
    Ok(match tag {
        b'R' => {
            let id = rel(&mut c)?;
            let namespace = c.cstring()?;
            let name = c.cstring()?;
            let full = c.u8()? == b'f';
            let n = c.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let flags = c.u8()?;
                let name = c.cstring()?;
                let type_oid = c.i32()? as u32;
                let typmod = c.i32()?;
                columns.push(RelColumn {
                    name,
                    type_oid,
                    typmod,
                    key: flags & 1 == 1,
                });
            }
            Message::Relation {
                id,
                namespace,
                name,
                columns,
                full,
            }
        }
        b'I' => {
            let rel = rel(&mut c)?;
            match c.u8()? {
                b'N' => Message::Insert {
                    rel,
                    new: c.tuple()?,
                },
                other => return Err(c.err(format!("an insert without a new tuple ({other:#04x})"))),
            }
        }
        b'U' => {
            let rel = rel(&mut c)?;
            let mut old = None;
            let mut kind = c.u8()?;
            if kind == b'K' || kind == b'O' {
                old = Some(c.tuple()?);
                kind = c.u8()?;
            }
            if kind != b'N' {
                return Err(c.err(format!("an update without a new tuple ({kind:#04x})")));
            }
            Message::Update {
                rel,
                old,
                new: c.tuple()?,
            }
        }
        b'D' => {
            let rel = rel(&mut c)?;
            match c.u8()? {
                b'K' | b'O' => Message::Delete {
                    rel,
                    old: c.tuple()?,
                },
                other => return Err(c.err(format!("a delete without its old key ({other:#04x})"))),
            }
        }
        b'T' => {
            let n = c.i32()?;
            let _options = c.u8()?;
            let mut rels = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                rels.push(rel(&mut c)?);
            }
            Message::Truncate { rels }
        }
        other => Message::Other(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cstr(b: &mut Vec<u8>, s: &str) {
        b.extend_from_slice(s.as_bytes());
        b.push(0);
    }

    fn tuple(b: &mut Vec<u8>, values: &[Option<&str>]) {
        b.extend_from_slice(&(values.len() as i16).to_be_bytes());
        for v in values {
            match v {
                None => b.push(b'n'),
                Some("<u>") => b.push(b'u'),
                Some(s) => {
                    b.push(b't');
                    b.extend_from_slice(&(s.len() as i32).to_be_bytes());
                    b.extend_from_slice(s.as_bytes());
                }
            }
        }
    }

    #[test]
    fn lsns_read_and_print_as_postgres_writes_them() {
        let l = Lsn::parse("16/B374D848").expect("lsn");
        assert_eq!(l.0, 0x16_B374_D848);
        assert_eq!(l.to_string(), "16/B374D848");
        assert_eq!(Lsn::parse("0/0"), Some(Lsn(0)));
        assert!(Lsn(5) < Lsn::parse("0/6").expect("lsn"));
        for bad in ["", "16", "x/1", "1/100000000"] {
            assert_eq!(Lsn::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn relations_and_changes_decode_with_nulls_and_unchanged_values() {
        let mut r = vec![b'R'];
        r.extend_from_slice(&16385i32.to_be_bytes());
        cstr(&mut r, "public");
        cstr(&mut r, "orders");
        r.push(b'd');
        r.extend_from_slice(&2i16.to_be_bytes());
        r.push(1);
        cstr(&mut r, "id");
        r.extend_from_slice(&20i32.to_be_bytes());
        r.extend_from_slice(&(-1i32).to_be_bytes());
        r.push(0);
        cstr(&mut r, "note");
        r.extend_from_slice(&25i32.to_be_bytes());
        r.extend_from_slice(&(-1i32).to_be_bytes());
        let m = decode(&r).expect("relation");
        let Message::Relation {
            id,
            name,
            columns,
            full,
            ..
        } = m
        else {
            panic!("{m:?}")
        };
        assert_eq!((id, name.as_str()), (16385, "orders"));
        assert!(!full, "identity 'd' is the key's");
        assert!(columns[0].key && !columns[1].key);
        assert_eq!(columns[1].type_oid, 25);

        let mut u = vec![b'U'];
        u.extend_from_slice(&16385i32.to_be_bytes());
        u.push(b'K');
        tuple(&mut u, &[Some("7"), None]);
        u.push(b'N');
        tuple(&mut u, &[Some("8"), Some("<u>")]);
        assert_eq!(
            decode(&u).expect("update"),
            Message::Update {
                rel: 16385,
                old: Some(vec![Value::Text("7".into()), Value::Null]),
                new: vec![Value::Text("8".into()), Value::Unchanged],
            }
        );

        let mut d = vec![b'D'];
        d.extend_from_slice(&16385i32.to_be_bytes());
        d.push(b'K');
        tuple(&mut d, &[Some("8"), None]);
        assert!(matches!(decode(&d), Ok(Message::Delete { rel: 16385, .. })));

        let mut t = vec![b'T'];
        t.extend_from_slice(&2i32.to_be_bytes());
        t.push(0);
        t.extend_from_slice(&1i32.to_be_bytes());
        t.extend_from_slice(&2i32.to_be_bytes());
        assert_eq!(
            decode(&t).expect("truncate"),
            Message::Truncate { rels: vec![1, 2] }
        );
    }

    #[test]
    fn a_truncated_or_unknown_value_is_an_error_naming_the_message() {
        let mut i = vec![b'I'];
        i.extend_from_slice(&1i32.to_be_bytes());
        i.push(b'N');
        i.extend_from_slice(&1i16.to_be_bytes());
        i.push(b't');
        i.extend_from_slice(&10i32.to_be_bytes());
        i.extend_from_slice(b"abc");
        let e = decode(&i).expect_err("truncated");
        assert_eq!(e.tag, 'I');
        assert!(e.reason.contains("truncated"), "{e}");
        let mut i = vec![b'I'];
        i.extend_from_slice(&1i32.to_be_bytes());
        i.push(b'N');
        i.extend_from_slice(&1i16.to_be_bytes());
        i.push(b'x');
        assert!(decode(&i)
            .expect_err("kind")
            .reason
            .contains("unknown tuple value kind"));
        assert!(decode(&[]).is_err());
    }
}
