//! What one read of a key gives: the etcd names of a key ([`Names`]), its record and waiter
//! registration, or everything of it ([`State`]: also its kind key and permit keys), as owned
//! copies ([`Kv`]) that the pure plans of [`lock`](super::lock) and [`permits`](super::permits)
//! take, and that their tests build without a server.

use super::EtcdStore;
use crate::error::Result;
use crate::key::Key;
use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};

/// One etcd key as read: its name, value and revisions, and the lease it is attached to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Kv {
    key: Vec<u8>,
    value: Vec<u8>,
    create_revision: i64,
    mod_revision: i64,
    lease: i64,
}

impl Kv {
    /// A key as read: `key` holding `value`, created at `create_revision`, last written at
    /// `mod_revision`, attached to `lease` (0: none).
    pub(super) fn new(
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        create_revision: i64,
        mod_revision: i64,
        lease: i64,
    ) -> Self {
        Kv {
            key: key.into(),
            value: value.into(),
            create_revision,
            mod_revision,
            lease,
        }
    }

    pub(super) fn key(&self) -> &[u8] {
        &self.key
    }

    /// The key's name, `None` unless UTF-8.
    pub(super) fn key_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.key).ok()
    }

    pub(super) fn value(&self) -> &[u8] {
        &self.value
    }

    pub(super) fn create_revision(&self) -> i64 {
        self.create_revision
    }

    pub(super) fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    pub(super) fn lease(&self) -> i64 {
        self.lease
    }
}

impl From<KeyValue> for Kv {
    fn from(kv: KeyValue) -> Self {
        Kv::new(
            kv.key(),
            kv.value(),
            kv.create_revision(),
            kv.mod_revision(),
            kv.lease(),
        )
    }
}

/// Everything of one key, read in one transaction.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) lock: Option<Kv>,
    pub(super) waiter: Option<Kv>,
    pub(super) kind: Option<Kv>,
    /// The permit keys, in key order.
    pub(super) slots: Vec<Kv>,
}

/// The etcd names of one key.
pub(super) struct Names {
    pub(super) lock: String,
    pub(super) waiter: String,
    pub(super) kind: String,
    /// The prefix of its permit keys.
    pub(super) prefix: String,
}

impl Names {
    /// The permit key of `slot`.
    pub(super) fn slot(&self, slot: &str) -> String {
        format!("{}{slot}", self.prefix)
    }
}

/// The gets of [`State`], in its order.
pub(super) fn state_ops(n: &Names) -> Vec<TxnOp> {
    vec![
        TxnOp::get(n.lock.clone(), None),
        TxnOp::get(n.waiter.clone(), None),
        TxnOp::get(n.kind.clone(), None),
        TxnOp::get(n.prefix.clone(), Some(GetOptions::new().with_prefix())),
    ]
}

/// The key-values of each get of a transaction's branch, in order.
pub(super) fn gets(r: TxnResponse) -> Vec<Vec<Kv>> {
    r.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(mut g) => Some(g.take_kvs().into_iter().map(Kv::from).collect()),
            _ => None,
        })
        .collect()
}

/// The [`State`] in the gets of a transaction's answer ([`state_ops`], after any other op).
pub(super) fn parse_state(r: TxnResponse) -> State {
    let mut gets = gets(r);
    if gets.len() < 4 {
        return State::default();
    }
    let slots = gets.pop().unwrap_or_default();
    let mut first = |v: Vec<Kv>| v.into_iter().next();
    let kind = gets.pop().and_then(&mut first);
    let waiter = gets.pop().and_then(&mut first);
    let lock = gets.pop().and_then(&mut first);
    State {
        lock,
        waiter,
        kind,
        slots,
    }
}

/// The first key-value of each of the two gets of a transaction's branch.
fn two_gets(r: TxnResponse) -> (Option<Kv>, Option<Kv>) {
    let mut got = gets(r).into_iter().map(|g| g.into_iter().next());
    (got.next().flatten(), got.next().flatten())
}

impl EtcdStore {
    pub(super) fn names(&self, key: &Key) -> Names {
        Names {
            lock: self.lock_name(key),
            waiter: self.waiter_name(key),
            kind: format!("{}{}", self.inner.kinds, key.as_str()),
            prefix: format!("{}{}\0", self.inner.permits, key.as_str()),
        }
    }

    /// The record and waiter registration of `key` in one read.
    pub(super) async fn read(&self, key: &Key) -> Result<(Option<Kv>, Option<Kv>)> {
        let (l, w) = (self.lock_name(key), self.waiter_name(key));
        let r = self
            .txn(Txn::new().and_then([TxnOp::get(l, None), TxnOp::get(w, None)]))
            .await?;
        Ok(two_gets(r))
    }

    /// Everything of `key` in one read.
    pub(super) async fn read_state(&self, n: &Names) -> Result<State> {
        let r = self.txn(Txn::new().and_then(state_ops(n))).await?;
        Ok(parse_state(r))
    }
}
