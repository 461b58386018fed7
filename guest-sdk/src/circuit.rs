//! The circuit: a graph of operators built once by user code, then run one
//! step at a time on Z-set deltas.

use crate::batch::EventBatch;
use crate::codec;
use crate::error::{Error, Result};
use crate::exchange::{Exchange, RawEvent};
use crate::identity::OperatorInfo;
use crate::state::{Shards, WHOLE};
use crate::table::Change;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::rc::Rc;

/// What a stream can carry: plain, ordered, serializable values.
///
/// Ordering makes consolidation and every operator's output deterministic,
/// which the host relies on when it replays a step.
pub trait Data: Clone + Ord + Debug + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Ord + Debug + Serialize + DeserializeOwned + 'static> Data for T {}

/// Index of a node in the circuit graph; nodes are numbered in creation order,
/// which is a topological order.
pub(crate) type NodeId = usize;

/// Everything an operator may touch while it runs one step.
pub(crate) struct StepContext<'a> {
    /// Input events per input port (values are JSON).
    pub inputs: &'a [EventBatch],
    /// Output events per output port (values are JSON).
    pub outputs: &'a mut [EventBatch],
    /// The exchange between workers.
    pub exchange: &'a mut dyn Exchange,
}

/// One node of the graph, type-erased. Each operator downcasts its inputs to
/// the `ZSet` types it was built with; the builder guarantees they match.
pub(crate) trait Operator {
    /// A stable name, recorded in snapshots to catch shape changes.
    fn name(&self) -> &'static str;
    /// Computes this step's output delta (a boxed `ZSet<_>`) from the input
    /// deltas of this step.
    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>>;
    /// [`eval`](Self::eval) with the inputs this operator is the last to
    /// read given to it ([`StepInput::Owned`]), so that it can free them
    /// before it builds its output: a key-heavy step then never holds an
    /// operator's input and output at once. By default the inputs are lent
    /// to `eval` and freed when it returns.
    fn eval_owned(
        &mut self,
        cx: &mut StepContext<'_>,
        inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        let refs: Vec<&dyn Any> = inputs.iter().map(StepInput::get).collect();
        self.eval(cx, &refs)
    }
    /// Whether the operator keeps state across steps (and so takes part in
    /// snapshots).
    fn stateful(&self) -> bool {
        false
    }
    /// The Rust types its state holds (keys, values, records), from which
    /// with [`name`](Self::name) its state fingerprint is computed (see
    /// [`OperatorInfo`]). Empty for a stateless operator.
    fn state_types(&self) -> String {
        String::new()
    }
    /// The operator's state split by shard (see [`crate::state`]): per
    /// shard holding any (of `only`, or all), the encoding of its entries.
    fn snapshot(&self, _only: Option<&Shards>) -> Result<BTreeMap<u32, Vec<u8>>> {
        Ok(BTreeMap::new())
    }
    /// Whether the operator reads state recorded under `name` in a
    /// snapshot (its own name, or an earlier one whose format it still
    /// reads).
    fn reads(&self, name: &str) -> bool {
        name == self.name()
    }
    /// Adds a piece of `shard`, recorded under `name`, written by
    /// [`snapshot`](Self::snapshot) — or, for shard [`WHOLE`], a whole
    /// state of the format before shards, which is encoded alike — to the
    /// operator's state.
    fn restore(&mut self, _name: &str, _shard: u32, _piece: &[u8]) -> Result<()> {
        Ok(())
    }
    /// Forgets the state of `shards` (handed off to another worker).
    fn forget(&mut self, _shards: &Shards) {}
    /// The shards whose state changed since the last [`clean`](Self::clean)
    /// (or since the operator was built or restored). An operator that
    /// does not track changes says every shard: it is always written whole.
    fn dirty(&self) -> Shards {
        Shards::all()
    }
    /// How the operator's changes in `shard` (one of [`dirty`](Self::dirty))
    /// since the last snapshot are written: whole (the default), as a
    /// delta piece that adds to the pieces written before, or not at all.
    fn delta(&self, _shard: u32) -> Result<Change> {
        Ok(Change::Whole)
    }
    /// Marks the state unchanged (a snapshot of it was taken, writing the
    /// shards in `whole` whole and the other changed ones as deltas).
    fn clean(&mut self, _whole: &Shards) {}
    /// Takes a migration from an earlier shape of its state (boxed as the
    /// operator expects it, e.g. a `Box<dyn Rekey<K>>` for a keyed sum);
    /// says why not where it has none of that kind.
    fn set_migration(&mut self, _migration: Box<dyn Any>) -> std::result::Result<(), String> {
        Err(format!(
            "a {} has no state migrations (keyed sums do: `count_by`, `sum_by`, `avg_by`)",
            self.name()
        ))
    }
    /// The fingerprints of earlier shapes of its state it migrates from
    /// (see [`set_migration`](Self::set_migration)).
    fn migrates_from(&self) -> Vec<u64> {
        Vec::new()
    }
    /// Adds a piece of `shard` written by the earlier state shape
    /// `fingerprint` (one of [`migrates_from`](Self::migrates_from)),
    /// through its migration. Its entries may land in other shards.
    fn migrate(&mut self, fingerprint: u64, _shard: u32, _piece: &[u8]) -> Result<()> {
        Err(Error::IncompatibleSnapshot(format!(
            "no migration from state fingerprint {fingerprint:016x}"
        )))
    }
}

pub(crate) struct Node {
    pub(crate) op: Box<dyn Operator>,
    /// A stateful operator's identity in snapshots: given by
    /// [`Stream::named`], else its default, once the circuit is built;
    /// empty for a stateless one.
    pub(crate) id: String,
    /// A stateful operator's default identity, `kind#n/total`, which a
    /// snapshot written before it was named still knows it by.
    pub(crate) default_id: String,
    /// Identities of earlier versions of the circuit it takes state under
    /// too ([`Stream::formerly`]).
    pub(crate) formerly: Vec<String>,
    /// The version of its state's meaning ([`Stream::state_version`]): 0
    /// unless bumped, part of its fingerprint otherwise.
    pub(crate) state_version: u32,
    /// Its state fingerprint (see [`OperatorInfo`]), once built.
    pub(crate) fingerprint: u64,
    inputs: Vec<NodeId>,
    /// The last node that reads this one's value (itself while none
    /// does): after it runs, the value is dropped.
    last_reader: NodeId,
}

impl Node {
    /// Whether a snapshot's state of operator `id` is this node's.
    pub(crate) fn answers_to(&self, id: &str) -> bool {
        self.id == id || self.default_id == id || self.formerly.iter().any(|f| f == id)
    }

    /// The types its state holds, with its state version if bumped: what
    /// its fingerprint is a hash of (with its kind).
    pub(crate) fn state_types(&self) -> String {
        crate::identity::versioned(self.op.state_types(), self.state_version)
    }

    /// Its identities other than `id`, for [`OperatorInfo`].
    fn aliases(&self) -> Vec<String> {
        let default = (self.default_id != self.id).then(|| self.default_id.clone());
        default.into_iter().chain(self.formerly.clone()).collect()
    }
}

#[derive(Default)]
pub(crate) struct Graph {
    pub(crate) nodes: Vec<Node>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    snapshot_version: u32,
    errors: Vec<String>,
}

impl Graph {
    pub(crate) fn add(&mut self, op: Box<dyn Operator>, inputs: Vec<NodeId>) -> NodeId {
        let id = self.nodes.len();
        for &i in &inputs {
            self.nodes[i].last_reader = id;
        }
        self.nodes.push(Node {
            op,
            id: String::new(),
            default_id: String::new(),
            formerly: Vec::new(),
            state_version: 0,
            fingerprint: 0,
            inputs,
            last_reader: id,
        });
        id
    }

    fn port(&mut self, kind: &str, name: &str, output: bool) -> usize {
        let ports = if output {
            &mut self.outputs
        } else {
            &mut self.inputs
        };
        if name.is_empty() || ports.iter().any(|p| p == name) {
            self.errors
                .push(format!("{kind} port name `{name}` is empty or used twice"));
        }
        let ports = if output {
            &mut self.outputs
        } else {
            &mut self.inputs
        };
        ports.push(name.to_owned());
        ports.len() - 1
    }
}

/// The builder handed to a circuit's build function.
///
/// ```
/// use sluice_guest::Circuit;
/// let instance = sluice_guest::CircuitInstance::build(|c: &mut Circuit| {
///     c.input::<i64>("numbers").filter(|n| *n > 0).output("positive");
/// })
/// .unwrap();
/// assert_eq!(instance.inputs(), ["numbers"]);
/// assert_eq!(instance.outputs(), ["positive"]);
/// ```
pub struct Circuit {
    graph: Rc<RefCell<Graph>>,
}

impl Circuit {
    /// Declares an input port whose events decode (from JSON) as `T`.
    pub fn input<T: Data>(&mut self, name: &str) -> Stream<T> {
        let mut g = self.graph.borrow_mut();
        let port = g.port("input", name, false);
        let node = g.add(
            Box::new(crate::operator::input::Input::<T>::new(port, name)),
            vec![],
        );
        Stream::new(self.graph.clone(), node)
    }

    /// Sets the circuit's snapshot version (default 1). Bump it when a
    /// change makes old checkpoints unreadable; restoring one then fails
    /// with a clear error instead of misreading state.
    pub fn snapshot_version(&mut self, version: u32) {
        self.graph.borrow_mut().snapshot_version = version;
    }
}

/// A stream of Z-set deltas of `T`, one delta per step.
///
/// Operators are methods on `Stream`; each returns a new stream.
pub struct Stream<T> {
    graph: Rc<RefCell<Graph>>,
    node: NodeId,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for Stream<T> {
    fn clone(&self) -> Self {
        Stream {
            graph: self.graph.clone(),
            node: self.node,
            _type: PhantomData,
        }
    }
}

impl<T: Data> Stream<T> {
    fn new(graph: Rc<RefCell<Graph>>, node: NodeId) -> Self {
        Stream {
            graph,
            node,
            _type: PhantomData,
        }
    }

    /// Adds an operator reading this stream and returns its output stream.
    pub(crate) fn unary<U: Data>(&self, op: impl Operator + 'static) -> Stream<U> {
        let node = self.graph.borrow_mut().add(Box::new(op), vec![self.node]);
        Stream::new(self.graph.clone(), node)
    }

    /// The first exchange channel of the operator added next: its node index
    /// shifted left by 4, leaving it 16 channels of its own. Every worker
    /// builds the same graph, so every worker numbers channels alike.
    pub(crate) fn next_channel(&self) -> u32 {
        (self.graph.borrow().nodes.len() as u32) << 4
    }

    /// Adds an operator reading this stream and `other` (in that order).
    pub(crate) fn binary<U: Data, O: Data>(
        &self,
        other: &Stream<U>,
        op: impl Operator + 'static,
    ) -> Stream<O> {
        if !Rc::ptr_eq(&self.graph, &other.graph) {
            self.graph
                .borrow_mut()
                .errors
                .push("an operator joins streams of two different circuits".into());
        }
        let node = self
            .graph
            .borrow_mut()
            .add(Box::new(op), vec![self.node, other.node]);
        Stream::new(self.graph.clone(), node)
    }

    /// Records a build error (reported by `CircuitInstance::build`).
    pub(crate) fn build_error(&self, message: String) {
        self.graph.borrow_mut().errors.push(message);
    }

    /// Sends this stream's deltas to the output port `name`, consolidated and
    /// encoded as JSON.
    pub fn output(&self, name: &str) {
        let mut g = self.graph.borrow_mut();
        let port = g.port("output", name, true);
        g.add(
            Box::new(crate::operator::output::Output::<T>::new(port)),
            vec![self.node],
        );
    }

    /// Names the stateful operator that produced this stream (the nearest
    /// one upstream through stateless one-input operators such as `map`):
    /// its identity in checkpoints, like Flink's `uid`. A checkpoint's
    /// state goes back to the operator of the same identity and state
    /// types, wherever it sits in the graph, so a circuit changed around
    /// it still restores it.
    ///
    /// Without a name a stateful operator is `kind#n/total`, the n-th of
    /// the `total` stateful operators of its kind in build order
    /// (`keyed_sum#0/2`): stable while stateless operators are added,
    /// removed or changed; adding or removing one of its kind renames all
    /// of them, and their states are then refused, not misplaced. An
    /// operator named since a snapshot was taken still takes its state
    /// under its default. The build fails if no stateful operator produced
    /// the stream, if it is named twice, or if two operators share a name.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// let instance = CircuitInstance::build(|c: &mut Circuit| {
    ///     c.input::<String>("words")
    ///         .count_by(|w| w.clone())
    ///         .named("word-counts")
    ///         .output("counts");
    /// })
    /// .unwrap();
    /// assert_eq!(instance.operators()[0].id, "word-counts");
    /// ```
    pub fn named(&self, id: &str) -> Stream<T> {
        let mut g = self.graph.borrow_mut();
        let mut node = self.node;
        while !g.nodes[node].op.stateful() && g.nodes[node].inputs.len() == 1 {
            node = g.nodes[node].inputs[0];
        }
        let error = if !g.nodes[node].op.stateful() {
            Some(format!(
                "named(\"{id}\"): no single stateful operator produced this stream (it \
                 comes from an input port or merges several streams: name each of them)"
            ))
        } else if !g.nodes[node].id.is_empty() {
            Some(format!(
                "named(\"{id}\"): the operator is named \"{}\" already",
                g.nodes[node].id
            ))
        } else if id.is_empty() || id.contains('#') {
            Some(format!(
                "named(\"{id}\"): a name is not empty and has no `#` (kept for defaults)"
            ))
        } else {
            None
        };
        match error {
            Some(e) => g.errors.push(e),
            None => g.nodes[node].id = id.to_owned(),
        }
        drop(g);
        self.clone()
    }

    /// Gives the stateful operator that produced this stream (as
    /// [`named`](Self::named) finds it) an identity of an earlier version
    /// of the circuit, whose state it takes from that version's snapshots:
    /// for an operator renamed, or one whose default identity changed
    /// because another operator of its kind was added or removed.
    ///
    /// ```
    /// # use sluice_guest::{Circuit, CircuitInstance};
    /// // Version 1 counted words with one unnamed count (`keyed_sum#0/1`);
    /// // version 2 adds a second count and keeps the first one's state.
    /// let instance = CircuitInstance::build(|c: &mut Circuit| {
    ///     let words = c.input::<String>("words");
    ///     words
    ///         .count_by(|w| w.clone())
    ///         .named("counts")
    ///         .formerly("keyed_sum#0/1")
    ///         .output("counts");
    ///     words.count_by(|w| w.len() as u64).named("lengths").output("lengths");
    /// })
    /// .unwrap();
    /// assert_eq!(instance.operators()[0].aliases, ["keyed_sum#0/2", "keyed_sum#0/1"]);
    /// ```
    pub fn formerly(&self, id: &str) -> Stream<T> {
        self.with_stateful(&format!("formerly(\"{id}\")"), |node| {
            if id.is_empty() {
                return Err("the identity is empty".into());
            }
            node.formerly.push(id.to_owned());
            Ok(())
        })
    }

    /// Applies `f` to the stateful operator that produced this stream (as
    /// [`named`](Self::named) finds it, through the stateless operators
    /// after it), recording a build error that starts with `what` where
    /// there is none or `f` fails.
    pub(crate) fn with_stateful(
        &self,
        what: &str,
        f: impl FnOnce(&mut Node) -> std::result::Result<(), String>,
    ) -> Stream<T> {
        let mut g = self.graph.borrow_mut();
        let mut node = self.node;
        while !g.nodes[node].op.stateful() && g.nodes[node].inputs.len() == 1 {
            node = g.nodes[node].inputs[0];
        }
        let done = if g.nodes[node].op.stateful() {
            f(&mut g.nodes[node])
        } else {
            Err("no single stateful operator produced this stream".into())
        };
        if let Err(e) = done {
            g.errors.push(format!("{what}: {e}"));
        }
        drop(g);
        self.clone()
    }
}

/// The format of the envelope around operator states in a snapshot piece:
/// 3 since operators are known by identity (and their state fingerprint
/// is checked); 2 knew them by node index, one envelope per shard; 1 was
/// one envelope per worker, holding every operator's whole state.
pub(crate) const ENVELOPE_FORMAT: u32 = 3;

/// The envelope of operators known by node index, which still restores.
const INDEXED_FORMAT: u32 = 2;

/// The envelope of the format before shards, which still restores.
const WHOLE_FORMAT: u32 = 1;

/// The start of every envelope: what follows depends on the format.
#[derive(Serialize, Deserialize)]
pub(crate) struct Header {
    pub(crate) format: u32,
    pub(crate) snapshot_version: u32,
}

/// A snapshot piece: the state of one shard, per stateful operator that
/// holds any there — its identity, kind, state fingerprint and state. The
/// byte strings are written and read as one copy each (`serde_bytes`), not
/// byte by byte; postcard's wire format is the same either way.
#[derive(Serialize)]
struct Envelope<'a> {
    format: u32,
    snapshot_version: u32,
    operators: Named<'a>,
}

/// What follows the header in formats 3 (`Named`) and 1–2 (node index,
/// kind, state: format 1 held every stateful operator's whole state).
pub(crate) type Named<'a> = Vec<(&'a str, &'a str, u64, &'a serde_bytes::Bytes)>;
type Indexed<'a> = Vec<(u32, &'a str, &'a serde_bytes::Bytes)>;

/// An instance's state as pieces: `(shard, bytes)`, one per shard holding
/// state, ordered by shard. Pieces of one shard from several instances add
/// up when restored into one.
pub type Pieces = Vec<(u32, Vec<u8>)>;

/// A built circuit, ready to run steps: what one worker instance holds.
pub struct CircuitInstance {
    pub(crate) graph: Graph,
}

impl CircuitInstance {
    /// Runs `build` to construct the circuit's graph.
    ///
    /// Fails if the build declared ports twice or with empty names.
    pub fn build(build: impl FnOnce(&mut Circuit)) -> Result<Self> {
        let graph = Rc::new(RefCell::new(Graph {
            snapshot_version: 1,
            ..Graph::default()
        }));
        build(&mut Circuit {
            graph: graph.clone(),
        });
        let graph = Rc::try_unwrap(graph)
            .map_err(|_| Error::Failed("a Stream outlived the circuit's build function".into()))?
            .into_inner();
        let mut graph = graph;
        crate::identity::resolve(
            graph
                .nodes
                .iter_mut()
                .filter(|n| n.op.stateful())
                .map(|n| (n.op.name(), &mut n.id, &mut n.default_id)),
            &mut graph.errors,
        );
        for node in graph.nodes.iter_mut().filter(|n| n.op.stateful()) {
            node.fingerprint = crate::identity::fingerprint(node.op.name(), &node.state_types());
            // A migration from the operator's own state would never run:
            // that state is carried as it is.
            if node.op.migrates_from().contains(&node.fingerprint) {
                graph.errors.push(format!(
                    "the migration of \"{}\" is from its own state types and version: bump \
                     its state_version to say the state changed meaning",
                    node.id
                ));
            }
        }
        // An earlier identity is one operator's: a snapshot's state must
        // have one place to go.
        let stateful: Vec<&Node> = graph.nodes.iter().filter(|n| n.op.stateful()).collect();
        for (i, node) in stateful.iter().enumerate() {
            for old in &node.formerly {
                if let Some(other) = stateful
                    .iter()
                    .enumerate()
                    .find(|(j, n)| *j != i && n.answers_to(old))
                {
                    graph.errors.push(format!(
                        "formerly(\"{old}\") of \"{}\": \"{}\" answers to that identity too",
                        node.id, other.1.id
                    ));
                }
            }
        }
        if !graph.errors.is_empty() {
            return Err(Error::Failed(graph.errors.join("; ")));
        }
        Ok(CircuitInstance { graph })
    }

    /// The stateful operators, in build order: each one's identity in
    /// checkpoints, kind and state fingerprint (what `sluice diff`
    /// compares between two versions of a circuit).
    pub fn operators(&self) -> Vec<OperatorInfo> {
        self.graph
            .nodes
            .iter()
            .filter(|n| n.op.stateful())
            .map(|n| {
                let mut info = OperatorInfo::new(&n.id, n.aliases(), n.op.name(), n.state_types());
                info.migrates_from = n.op.migrates_from();
                info
            })
            .collect()
    }

    /// Input port names, in port order.
    pub fn inputs(&self) -> &[String] {
        &self.graph.inputs
    }

    /// Output port names, in port order.
    pub fn outputs(&self) -> &[String] {
        &self.graph.outputs
    }

    /// The circuit's snapshot version.
    pub fn snapshot_version(&self) -> u32 {
        self.graph.snapshot_version
    }

    /// Runs one step. `inputs[p]` holds input port `p`'s events (JSON
    /// values); returns each output port's consolidated events. (A copy of
    /// [`step_batches`](Self::step_batches) for callers that hold events one
    /// by one, such as tests.)
    pub fn step(
        &mut self,
        inputs: Vec<Vec<RawEvent>>,
        exchange: &mut dyn Exchange,
    ) -> Result<Vec<Vec<RawEvent>>> {
        let inputs = inputs
            .iter()
            .map(|events| EventBatch::from_events(events))
            .collect::<Result<Vec<_>>>()?;
        Ok(self
            .step_batches(inputs, exchange)?
            .iter()
            .map(EventBatch::to_events)
            .collect())
    }

    /// Runs one step on packed events: `inputs[p]` holds input port `p`'s
    /// events (JSON values); returns each output port's consolidated events.
    /// Records are decoded from slices of the inputs and encoded straight
    /// into the outputs.
    pub fn step_batches(
        &mut self,
        mut inputs: Vec<EventBatch>,
        exchange: &mut dyn Exchange,
    ) -> Result<Vec<EventBatch>> {
        if inputs.len() > self.graph.inputs.len() {
            return Err(Error::Protocol(format!(
                "step got {} input ports, the circuit has {}",
                inputs.len(),
                self.graph.inputs.len()
            )));
        }
        inputs.resize_with(self.graph.inputs.len(), EventBatch::new);
        let mut outputs = vec![EventBatch::new(); self.graph.outputs.len()];
        let mut cx = StepContext {
            inputs: &inputs,
            outputs: &mut outputs,
            exchange,
        };
        // A node's value is dropped as soon as its last reader has run, so a
        // step holds only the batches still to be read, not every operator's
        // output at once (in a key-heavy step each is as large as the input).
        let mut values: Vec<Option<Box<dyn Any>>> = Vec::with_capacity(self.graph.nodes.len());
        for index in 0..self.graph.nodes.len() {
            // A node's inputs come before it.
            let (before, rest) = self.graph.nodes.split_at_mut(index);
            let node = &mut rest[0];
            let last = |i: NodeId| before[i].last_reader == index;
            // Inputs this node reads last (and once) are given to it.
            let mut given: Vec<Option<Box<dyn Any>>> = node
                .inputs
                .iter()
                .map(|&i| {
                    let once = node.inputs.iter().filter(|&&j| j == i).count() == 1;
                    (once && last(i)).then(|| values[i].take()).flatten()
                })
                .collect();
            let ins: Vec<StepInput<'_>> = node
                .inputs
                .iter()
                .zip(&mut given)
                .map(|(&i, given)| match given.take() {
                    Some(value) => StepInput::Owned(value),
                    None => StepInput::Shared(
                        values[i].as_deref().expect("inputs precede their readers"),
                    ),
                })
                .collect();
            let out = node.op.eval_owned(&mut cx, ins)?;
            values.push(Some(out));
            for &i in &node.inputs {
                if last(i) {
                    values[i] = None;
                }
            }
        }
        Ok(outputs)
    }

    /// The instance's state as pieces, one per shard holding any, each
    /// with the circuit's shape and snapshot version so that `restore` can
    /// refuse a mismatch. Every shard is unchanged afterwards.
    pub fn snapshot(&mut self) -> Result<Pieces> {
        let pieces = self.pieces(None)?;
        self.clean(&Shards::all());
        Ok(pieces)
    }

    /// The changes since the last snapshot (or restore), for an
    /// incremental checkpoint: the shards written whole (`changed`; one of
    /// them without a piece holds nothing now) and pieces — of those
    /// shards, whole, and of other shards, deltas that add to the pieces
    /// written before. With the previous checkpoint's pieces of the shards
    /// not in `changed`, they make the whole state.
    ///
    /// A shard is written whole when any operator needs it whole there (it
    /// does not write deltas, or its deltas since the shard was last whole
    /// would reach the shard's size); otherwise each operator that changed
    /// there writes its delta.
    pub fn snapshot_changed(&mut self) -> Result<(Vec<u32>, Pieces)> {
        let dirty: Vec<(usize, Shards)> = self
            .graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.op.stateful())
            .map(|(i, n)| (i, n.op.dirty()))
            .collect();
        let mut any = Shards::none();
        for (_, d) in &dirty {
            any.union(d);
        }
        let mut whole = Shards::none();
        let mut deltas: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        for shard in any.iter() {
            let mut states = Vec::new();
            let mut is_whole = false;
            for (i, d) in &dirty {
                if !d.contains(shard) {
                    continue;
                }
                let op = &self.graph.nodes[*i].op;
                match op.delta(shard)? {
                    Change::Nothing => {}
                    Change::Delta(bytes) => states.push((*i as u32, op.name(), bytes)),
                    Change::Whole => {
                        is_whole = true;
                        break;
                    }
                }
            }
            if is_whole {
                whole.insert(shard);
            } else if !states.is_empty() {
                deltas.insert(shard, self.envelope(states)?);
            }
        }
        let mut pieces: BTreeMap<u32, Vec<u8>> = self.pieces(Some(&whole))?.into_iter().collect();
        pieces.extend(deltas);
        self.clean(&whole);
        Ok((whole.iter().collect(), pieces.into_iter().collect()))
    }

    /// Marks every operator's state unchanged, the shards in `whole`
    /// written whole.
    fn clean(&mut self, whole: &Shards) {
        for node in &mut self.graph.nodes {
            if node.op.stateful() {
                node.op.clean(whole);
            }
        }
    }

    /// An envelope holding `states` (operator node, kind, state).
    fn envelope(&self, states: Vec<(u32, &'static str, Vec<u8>)>) -> Result<Vec<u8>> {
        codec::to_bytes(&Envelope {
            format: ENVELOPE_FORMAT,
            snapshot_version: self.graph.snapshot_version,
            operators: states
                .iter()
                .map(|(i, kind, state)| {
                    let node = &self.graph.nodes[*i as usize];
                    let state = serde_bytes::Bytes::new(state);
                    (node.id.as_str(), *kind, node.fingerprint, state)
                })
                .collect(),
        })
    }

    /// The pieces of `only` (all shards when `None`).
    fn pieces(&self, only: Option<&Shards>) -> Result<Pieces> {
        // Per shard: (operator node, operator name, its state there).
        type OperatorStates = Vec<(u32, &'static str, Vec<u8>)>;
        let mut by_shard: BTreeMap<u32, OperatorStates> = BTreeMap::new();
        for (i, node) in self.graph.nodes.iter().enumerate() {
            if node.op.stateful() {
                for (shard, state) in node.op.snapshot(only)? {
                    by_shard
                        .entry(shard)
                        .or_default()
                        .push((i as u32, node.op.name(), state));
                }
            }
        }
        by_shard
            .into_iter()
            .map(|(shard, states)| Ok((shard, self.envelope(states)?)))
            .collect()
    }

    /// Hands shards off: returns the pieces of `shards` (those holding
    /// state) and forgets them.
    pub fn export_shards(&mut self, shards: &[u32]) -> Result<Pieces> {
        let set: Shards = shards.iter().copied().collect();
        let pieces = self.pieces(Some(&set))?;
        for node in &mut self.graph.nodes {
            if node.op.stateful() {
                node.op.forget(&set);
            }
        }
        Ok(pieces)
    }

    /// Adds pieces written by [`snapshot`](Self::snapshot) or
    /// [`export_shards`](Self::export_shards) of a circuit with the same
    /// shape and snapshot version — or a whole state of the format before
    /// shards (shard [`WHOLE`]) — to this instance's state.
    pub fn restore(&mut self, pieces: &[(u32, Vec<u8>)]) -> Result<()> {
        for (shard, piece) in pieces {
            self.restore_piece(*shard, piece)?;
        }
        Ok(())
    }

    fn restore_piece(&mut self, shard: u32, state: &[u8]) -> Result<()> {
        let unreadable =
            |e: postcard::Error| Error::IncompatibleSnapshot(format!("unreadable envelope: {e}"));
        let (header, rest): (Header, &[u8]) =
            postcard::take_from_bytes(state).map_err(unreadable)?;
        let whole = match header.format {
            ENVELOPE_FORMAT | INDEXED_FORMAT => false,
            WHOLE_FORMAT => true,
            f => {
                return Err(Error::IncompatibleSnapshot(format!(
                    "envelope format {f} (this SDK reads {WHOLE_FORMAT} to {ENVELOPE_FORMAT})"
                )));
            }
        };
        if whole != (shard == WHOLE) {
            return Err(Error::IncompatibleSnapshot(format!(
                "a piece of shard {shard} holds an envelope of format {}",
                header.format
            )));
        }
        if header.snapshot_version != self.graph.snapshot_version {
            return Err(Error::IncompatibleSnapshot(format!(
                "snapshot version {} but the circuit reads version {}",
                header.snapshot_version, self.graph.snapshot_version
            )));
        }
        if header.format == ENVELOPE_FORMAT {
            let operators: Named = postcard::from_bytes(rest).map_err(unreadable)?;
            // Every operator is found before any takes its state: a piece
            // refused is not half restored.
            let nodes = operators
                .iter()
                .map(|(id, kind, fingerprint, _)| self.node_named(id, kind, *fingerprint))
                .collect::<Result<Vec<usize>>>()?;
            for (node, (id, kind, _, bytes)) in nodes.into_iter().zip(&operators) {
                let op = &mut self.graph.nodes[node].op;
                op.restore(kind, shard, bytes).map_err(|e| match e {
                    Error::IncompatibleSnapshot(m) => {
                        Error::IncompatibleSnapshot(format!("operator `{id}`: {m}"))
                    }
                    e => e,
                })?;
            }
            return Ok(());
        }
        let operators: Indexed = postcard::from_bytes(rest).map_err(unreadable)?;
        if whole {
            let stateful = self.graph.nodes.iter().filter(|n| n.op.stateful()).count();
            if stateful != operators.len() {
                return Err(Error::IncompatibleSnapshot(format!(
                    "snapshot holds {} stateful operators, the circuit has {stateful}",
                    operators.len(),
                )));
            }
        }
        for (index, name, bytes) in &operators {
            let op = self
                .graph
                .nodes
                .get_mut(*index as usize)
                .map(|n| &mut n.op)
                .filter(|op| op.stateful() && op.reads(name))
                .ok_or_else(|| {
                    Error::IncompatibleSnapshot(format!(
                        "operator {index} `{name}` in the snapshot is not a stateful operator \
                         of that name in the circuit"
                    ))
                })?;
            op.restore(name, shard, bytes)?;
        }
        Ok(())
    }

    /// The node of the stateful operator whose identity (or, for one
    /// named since, default identity) is `id`, if it reads state of `kind`
    /// with that `fingerprint`; else why the snapshot's state of `id` does
    /// not go back into this circuit.
    fn node_named(&self, id: &str, kind: &str, fingerprint: u64) -> Result<usize> {
        let refuse = |why: String| {
            Err(Error::IncompatibleSnapshot(format!(
                "operator `{id}` ({kind}) in the snapshot {why}"
            )))
        };
        let nodes = &self.graph.nodes;
        let Some(index) = nodes
            .iter()
            .position(|n| n.op.stateful() && n.answers_to(id))
        else {
            let hint = if id.contains('#') {
                " (an unnamed operator is known by its place among those of its kind: \
                 adding or removing one renames the others)"
            } else {
                ""
            };
            return refuse(format!("is not in the circuit{hint}"));
        };
        let node = &nodes[index];
        if !node.op.reads(kind) {
            return refuse(format!("is a {} in the circuit", node.op.name()));
        }
        if node.fingerprint != fingerprint {
            return refuse(format!(
                "holds state of other types than the circuit's ({})",
                node.state_types()
            ));
        }
        Ok(index)
    }
}

/// An operator's input in a step: lent, or given to it because no later
/// operator reads it.
pub(crate) enum StepInput<'a> {
    /// Another operator reads it later.
    Shared(&'a dyn Any),
    /// This operator is its last reader: dropping it frees it.
    Owned(Box<dyn Any>),
}

impl StepInput<'_> {
    /// The input, to read.
    pub(crate) fn get(&self) -> &dyn Any {
        match self {
            StepInput::Shared(v) => *v,
            StepInput::Owned(v) => &**v,
        }
    }

    /// The input as the Z-set type the builder promised.
    pub(crate) fn zset<T: 'static>(&self) -> &crate::ZSet<T> {
        self.get()
            .downcast_ref::<crate::ZSet<T>>()
            .expect("the builder connects streams of matching types")
    }

    /// The input as a Z-set of its own: moved if this operator was given
    /// it, cloned if lent.
    pub(crate) fn into_zset<T: Clone + 'static>(self) -> crate::ZSet<T> {
        match self {
            StepInput::Shared(_) => self.zset::<T>().clone(),
            StepInput::Owned(v) => *v
                .downcast::<crate::ZSet<T>>()
                .expect("the builder connects streams of matching types"),
        }
    }

    /// Each record and its weight through `given` when this operator was
    /// given the input (the records move), through `lent` when it was lent
    /// it: how an operator that keeps or passes on its records takes them
    /// without cloning what it was given.
    pub(crate) fn map_records<T: 'static, U>(
        self,
        given: impl FnMut((T, crate::Weight)) -> U,
        lent: impl FnMut(&(T, crate::Weight)) -> U,
    ) -> Vec<U> {
        match self {
            StepInput::Shared(_) => self.zset::<T>().iter().map(lent).collect(),
            StepInput::Owned(_) => self
                .into_owned::<T>()
                .expect("an input not lent is given")
                .into_iter()
                .map(given)
                .collect(),
        }
    }

    /// The input itself, if this operator was given it.
    pub(crate) fn into_owned<T: 'static>(self) -> Option<crate::ZSet<T>> {
        match self {
            StepInput::Shared(_) => None,
            StepInput::Owned(v) => Some(
                *v.downcast::<crate::ZSet<T>>()
                    .expect("the builder connects streams of matching types"),
            ),
        }
    }
}

/// Downcasts an operator input to the Z-set type the builder promised.
pub(crate) fn input<'a, T: 'static>(inputs: &[&'a dyn Any], i: usize) -> &'a crate::ZSet<T> {
    inputs[i]
        .downcast_ref::<crate::ZSet<T>>()
        .expect("the builder connects streams of matching types")
}
