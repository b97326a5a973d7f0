//! HTTP/2 stream priority (RFC 7540 5.3), as nginx keeps it: the h2 crate parses PRIORITY
//! frames and HEADERS priority fields but ignores them, so `conn::h2_mend` hands them here
//! before the codec reads them, and a stream's sending half (`conn::h2_response::Out`) asks
//! for its turn before it queues DATA.
//!
//! The tree is nginx's (ngx_http_v2_set_dependency and friends): each stream a node with a
//! weight, a rank (its depth) and a relative weight (its share of its parent's), nodes of
//! idle streams made by PRIORITY frames and of closed streams kept, up to 32 of them, the
//! oldest dropped first (its children moved to its parent, their weights shared out). A
//! new dependency on a stream's own descendant moves that descendant up first.
//!
//! nginx queues each stream's frames by rank, then relative weight, before it writes them:
//! when a window opens for several streams at once (a WINDOW_UPDATE, a SETTINGS), those of
//! a lower rank go first, then the heavier. The h2 crate writes streams' DATA in the order
//! they were queued, so gannet queues them in nginx's order: a stream that has window
//! capacity while others also wait to send lets every stream woken with it come forward
//! (one yield to the scheduler), then queues its DATA only when no better one is ready.
//! Only connections whose client spoke of priority at all, and only while two streams or
//! more are sending, pay for that.
//!
//! A stream that depends on itself ends the connection with GOAWAY PROTOCOL_ERROR, as in
//! nginx (RFC 9113 asks for a stream error; the codec resets the stream): the mend gives the
//! codec a PRIORITY frame on stream 0 in its place, which the codec answers that way.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// nginx's NGX_HTTP_V2_DEFAULT_WEIGHT.
const DEFAULT_WEIGHT: u32 = 16;
/// Nodes of closed (and idle) streams kept, as nginx's (ngx_http_v2_get_node_by_id).
const CLOSED_MAX: usize = 32;
/// Past this many nodes (streams the codec refused never close here) the tree starts over:
/// a bound on what a client can make the server keep.
const NODES_MAX: usize = 4096;
/// The root's id: stream 0 is never a stream.
const ROOT: u32 = 0;

/// A frame the codec answers with GOAWAY PROTOCOL_ERROR: PRIORITY on stream 0.
pub(super) const CONNECTION_ERROR: [u8; 14] = [0, 0, 5, 0x2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

#[derive(Default)]
struct Node {
    /// `None`: just made, not in the tree yet; `Some(ROOT)`: at the top.
    parent: Option<u32>,
    weight: u32,
    rank: u32,
    rel: f64,
    children: Vec<u32>,
    /// A stream being served (else idle or closed: in `closed`).
    open: bool,
}

/// The dependency tree of a connection's streams.
#[derive(Default)]
struct Tree {
    nodes: HashMap<u32, Node>,
    /// The root's children.
    top: Vec<u32>,
    /// Nodes without a stream, oldest first.
    closed: VecDeque<u32>,
    /// The client sent priority information (else every stream is alike).
    prioritized: bool,
}

impl Tree {
    fn children(&mut self, of: u32) -> Option<&mut Vec<u32>> {
        if of == ROOT {
            Some(&mut self.top)
        } else {
            self.nodes.get_mut(&of).map(|n| &mut n.children)
        }
    }

    fn unlink(&mut self, from: u32, id: u32) {
        if let Some(list) = self.children(from) {
            list.retain(|&c| c != id);
        }
    }

    fn forget_closed(&mut self, id: u32) -> bool {
        match self.closed.iter().position(|&c| c == id) {
            Some(i) => {
                self.closed.remove(i);
                true
            }
            None => false,
        }
    }

    /// Whether node `id` exists afterwards (with `alloc`, made if need be).
    fn node(&mut self, id: u32, alloc: bool) -> bool {
        if self.nodes.contains_key(&id) {
            return true;
        }
        if !alloc {
            return false;
        }
        if self.closed.len() >= CLOSED_MAX {
            self.drop_oldest_closed();
        }
        if self.nodes.len() >= NODES_MAX {
            *self = Tree {
                prioritized: self.prioritized,
                ..Tree::default()
            };
        }
        self.nodes.insert(id, Node::default());
        true
    }

    /// nginx's ngx_http_v2_get_closed_node: the oldest closed node leaves the tree, its
    /// children take its place with its weight shared out among them.
    fn drop_oldest_closed(&mut self) {
        let Some(id) = self.closed.pop_front() else {
            return;
        };
        let Some(node) = self.nodes.remove(&id) else {
            return;
        };
        let parent = node.parent.unwrap_or(ROOT);
        self.unlink(parent, id);
        let sum: u32 = node
            .children
            .iter()
            .filter_map(|c| self.nodes.get(c).map(|n| n.weight))
            .sum();
        for c in &node.children {
            if let Some(n) = self.nodes.get_mut(c) {
                n.parent = Some(parent);
                n.weight = (node.weight * n.weight / sum.max(1)).max(1);
            }
        }
        let (rank, rel) = match self.nodes.get(&parent) {
            Some(p) => (p.rank, p.rel),
            None => (0, 1.0),
        };
        self.relabel(&node.children, rank, rel);
        if let Some(list) = self.children(parent) {
            list.extend_from_slice(&node.children);
        }
    }

    /// The ranks and relative weights below `id` follow its own (ngx_http_v2_node_children_update).
    fn relabel_below(&mut self, id: u32) {
        if let Some(n) = self.nodes.get(&id) {
            let (kids, rank, rel) = (n.children.clone(), n.rank, n.rel);
            self.relabel(&kids, rank, rel);
        }
    }

    /// `kids` are children of a node of `rank` and relative weight `rel`: they and theirs
    /// are ranked again.
    fn relabel(&mut self, kids: &[u32], rank: u32, rel: f64) {
        let mut todo: Vec<(u32, u32, f64)> = kids.iter().map(|&k| (k, rank, rel)).collect();
        // A tree has as many edges as nodes: more steps would mean a cycle.
        let mut steps = self.nodes.len();
        while let Some((k, rank, rel)) = todo.pop() {
            if steps == 0 {
                return;
            }
            steps -= 1;
            if let Some(n) = self.nodes.get_mut(&k) {
                n.rank = rank + 1;
                n.rel = rel / 256.0 * f64::from(n.weight);
                todo.extend(n.children.iter().map(|&c| (c, n.rank, n.rel)));
            }
        }
    }

    fn rank_rel(&self, id: u32) -> (u32, f64) {
        self.nodes.get(&id).map_or((0, 1.0), |n| (n.rank, n.rel))
    }

    /// nginx's ngx_http_v2_set_dependency: node `id` (with its weight set) comes under
    /// `depend` (the root if that is 0 or unknown), alone there if `exclusive`.
    fn set_dependency(&mut self, id: u32, depend: u32, mut exclusive: bool) {
        let weight = self.nodes.get(&id).map_or(DEFAULT_WEIGHT, |n| n.weight);
        let parent = if depend != ROOT && self.nodes.contains_key(&depend) {
            depend
        } else {
            ROOT
        };
        let (rank, rel) = if parent == ROOT {
            if depend != ROOT {
                exclusive = false;
            }
            (1, f64::from(weight) / 256.0)
        } else {
            self.lift_descendant(id, parent, exclusive);
            let (prank, prel) = self.rank_rel(parent);
            if self.nodes.get(&parent).is_some_and(|p| !p.open) && self.forget_closed(parent) {
                self.closed.push_back(parent);
            }
            (prank + 1, prel / 256.0 * f64::from(weight))
        };
        if let Some(n) = self.nodes.get_mut(&id) {
            n.rank = rank;
            n.rel = rel;
        }
        if exclusive {
            let kids = self
                .children(parent)
                .map(std::mem::take)
                .unwrap_or_default();
            for k in &kids {
                if let Some(n) = self.nodes.get_mut(k) {
                    n.parent = Some(id);
                }
            }
            if let Some(n) = self.nodes.get_mut(&id) {
                n.children.extend_from_slice(&kids);
            }
        }
        // Out of the list it is in (its own children's, when it was among the siblings it
        // just took over).
        if let Some(cur) = self.nodes.get(&id).and_then(|n| n.parent) {
            self.unlink(cur, id);
        }
        if let Some(list) = self.children(parent) {
            list.push(id);
        }
        if let Some(n) = self.nodes.get_mut(&id) {
            n.parent = Some(parent);
        }
        self.relabel_below(id);
    }

    /// When `parent`, the node `id` is to depend on, is below `id`: `parent` first takes
    /// `id`'s place (nginx finds it by walking up while the ranks are not above `id`'s).
    fn lift_descendant(&mut self, id: u32, parent: u32, exclusive: bool) {
        let Some((Some(place), rank)) = self.nodes.get(&id).map(|n| (n.parent, n.rank)) else {
            return;
        };
        let mut next = self.nodes.get(&parent).and_then(|n| n.parent);
        let mut steps = self.nodes.len();
        while let Some(n) = next.filter(|&n| n != ROOT) {
            let Some(node) = self.nodes.get(&n) else {
                return;
            };
            if node.rank < rank || steps == 0 {
                return;
            }
            steps -= 1;
            if n != id {
                next = node.parent;
                continue;
            }
            let old = self
                .nodes
                .get(&parent)
                .and_then(|p| p.parent)
                .unwrap_or(ROOT);
            self.unlink(old, parent);
            if let Some(list) = self.children(place) {
                let at = list
                    .iter()
                    .position(|&c| c == id)
                    .map_or(list.len(), |i| i + 1);
                list.insert(at, parent);
            }
            let (prank, prel) = if place == ROOT {
                (0, 1.0)
            } else {
                self.rank_rel(place)
            };
            if let Some(p) = self.nodes.get_mut(&parent) {
                p.parent = Some(place);
                p.rank = prank + 1;
                p.rel = prel / 256.0 * f64::from(p.weight);
            }
            if !exclusive {
                self.relabel_below(parent);
            }
            return;
        }
    }

    /// A PRIORITY frame for stream `id` (not 0, not depending on itself).
    fn priority(&mut self, id: u32, depend: u32, exclusive: bool, weight: u32) {
        self.prioritized = true;
        if !self.node(id, true) {
            return;
        }
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        n.weight = weight;
        if !n.open {
            // A new node counts as closed from now; a closed one becomes the newest.
            self.forget_closed(id);
            self.closed.push_back(id);
        }
        self.set_dependency(id, depend, exclusive);
    }

    /// A request's HEADERS on stream `id`, with its priority fields if it had them.
    fn opened(&mut self, id: u32, priority: Option<(u32, bool, u32)>) {
        if priority.is_some() {
            self.prioritized = true;
        }
        if !self.node(id, true) {
            return;
        }
        self.forget_closed(id);
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        n.open = true;
        if priority.is_some() || n.parent.is_none() {
            let (depend, exclusive, weight) = priority.unwrap_or((0, false, DEFAULT_WEIGHT));
            n.weight = weight;
            self.set_dependency(id, depend, exclusive);
        }
    }

    fn closed(&mut self, id: u32) {
        if let Some(n) = self.nodes.get_mut(&id) {
            if n.open {
                n.open = false;
                self.closed.push_back(id);
            }
        }
    }

    /// Whether `a` goes before `b` (nginx's ngx_http_v2_queue_frame: lower rank, then the
    /// larger relative weight; alike, the first come).
    fn before(&self, a: (u32, u64), b: (u32, u64)) -> bool {
        let ((ra, wa), (rb, wb)) = (self.key(a.0), self.key(b.0));
        ra < rb || (ra == rb && (wa > wb || (wa == wb && a.1 < b.1)))
    }

    fn key(&self, id: u32) -> (u32, f64) {
        self.nodes
            .get(&id)
            .map_or((1, f64::from(DEFAULT_WEIGHT) / 256.0), |n| (n.rank, n.rel))
    }
}

/// A connection's priorities and the streams waiting for their turn to queue DATA.
#[derive(Default)]
pub struct Priorities {
    tree: RefCell<Tree>,
    /// Streams in the middle of sending a body (waiting for window, or queueing DATA).
    sending: Cell<usize>,
    /// Streams with window capacity, waiting for their turn: id and arrival.
    ready: RefCell<Vec<(u32, u64)>>,
    arrivals: Cell<u64>,
    waiters: RefCell<Vec<Waker>>,
}

impl Priorities {
    /// A complete PRIORITY frame (9 + 5 bytes) read from the client, before the codec
    /// reads it: noted, or made a connection error when the stream depends on itself.
    pub(super) fn priority_frame(&self, frame: &mut [u8]) {
        let Some(&[a, b, c, d, e, f, g, h, w]) = frame.get(5..14) else {
            return;
        };
        let id = u32::from_be_bytes([a & 0x7f, b, c, d]);
        let depend = u32::from_be_bytes([e & 0x7f, f, g, h]);
        if id == 0 {
            // The codec's error to find.
            return;
        }
        if depend == id {
            frame[5..9].fill(0);
            return;
        }
        let mut tree = self.tree.borrow_mut();
        tree.priority(id, depend, e & 0x80 != 0, u32::from(w) + 1);
        drop(tree);
        self.wake();
    }

    /// A request's header block (a HEADERS frame and its CONTINUATION frames): its stream
    /// noted with its priority fields. False when the stream depends on itself (then the
    /// connection is to end, see the module docs).
    pub(super) fn request(&self, block: &[u8]) -> bool {
        let Some(h) = block.get(..9) else {
            return true;
        };
        let id = u32::from_be_bytes([h[5] & 0x7f, h[6], h[7], h[8]]);
        let flags = h[4];
        let mut at = 9;
        if flags & 0x8 != 0 {
            at += 1;
        }
        let priority = if flags & 0x20 != 0 {
            let Some(&[a, b, c, d, w]) = block.get(at..at + 5) else {
                // Too short: the codec's error to find.
                return true;
            };
            let depend = u32::from_be_bytes([a & 0x7f, b, c, d]);
            if depend == id {
                return false;
            }
            Some((depend, a & 0x80 != 0, u32::from(w) + 1))
        } else {
            None
        };
        self.tree.borrow_mut().opened(id, priority);
        true
    }

    fn closed(&self, id: u32) {
        self.tree.borrow_mut().closed(id);
    }

    /// Waiting streams look again at whose turn it is.
    fn wake(&self) {
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    fn contended(&self) -> bool {
        self.sending.get() > 1 && self.tree.borrow().prioritized
    }

    /// Whether stream `id` is the first of those ready.
    fn first(&self, id: u32) -> bool {
        let ready = self.ready.borrow();
        let tree = self.tree.borrow();
        let Some(&me) = ready.iter().find(|r| r.0 == id) else {
            return true;
        };
        !ready.iter().any(|&o| o.0 != id && tree.before(o, me))
    }
}

/// The stream a task serves, and its connection's priorities.
struct Served {
    prio: Rc<Priorities>,
    id: u32,
}

tokio::task_local! {
    static SERVED: Served;
}

/// Run stream `id`'s task `f` with its connection's priorities at hand; the stream's node
/// is closed when the task ends.
pub(super) async fn scope<F: Future>(prio: Rc<Priorities>, id: u32, f: F) -> F::Output {
    struct Close(Rc<Priorities>, u32);
    impl Drop for Close {
        fn drop(&mut self) {
            self.0.closed(self.1);
        }
    }
    let _close = Close(prio.clone(), id);
    SERVED.scope(Served { prio, id }, f).await
}

/// Held while a stream sends a body: it counts among the streams that may compete.
pub(super) struct Sending(Option<Rc<Priorities>>);

pub(super) fn sending() -> Sending {
    Sending(
        SERVED
            .try_with(|s| {
                s.prio.sending.set(s.prio.sending.get() + 1);
                s.prio.clone()
            })
            .ok(),
    )
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.sending.set(p.sending.get() - 1);
        }
    }
}

/// A stream's turn to queue DATA, held until it has: then the next one's comes.
pub(super) struct Turn(Option<(Rc<Priorities>, u32)>);

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some((p, id)) = &self.0 {
            p.ready.borrow_mut().retain(|r| r.0 != *id);
            p.wake();
        }
    }
}

/// Wait for this stream's turn to queue DATA (it has window capacity): at once unless the
/// client prioritized streams and others are sending too. Queue the DATA before the turn
/// is dropped, without waiting in between.
pub(super) async fn turn() -> Turn {
    let Ok(Some((prio, id))) =
        SERVED.try_with(|s| s.prio.contended().then(|| (s.prio.clone(), s.id)))
    else {
        return Turn(None);
    };
    let seq = prio.arrivals.get();
    prio.arrivals.set(seq + 1);
    prio.ready.borrow_mut().push((id, seq));
    let turn = Turn(Some((prio.clone(), id)));
    // The streams the same window update woke run before this one goes on.
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| {
        if prio.first(id) {
            return Poll::Ready(());
        }
        let mut waiters = prio.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
    })
    .await;
    turn
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prio(t: &mut Tree, id: u32, dep: u32, w: u32) {
        t.priority(id, dep, false, w);
    }

    fn order(t: &Tree, ids: &[u32]) -> Vec<u32> {
        let mut v: Vec<(u32, u64)> = ids
            .iter()
            .enumerate()
            .map(|(i, &d)| (d, i as u64))
            .collect();
        v.sort_by(|&a, &b| {
            if t.before(a, b) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        v.into_iter().map(|x| x.0).collect()
    }

    #[test]
    fn weights_and_dependencies_order_streams() {
        let mut t = Tree::default();
        t.opened(1, None);
        t.opened(3, None);
        prio(&mut t, 1, 0, 1);
        prio(&mut t, 3, 0, 256);
        assert_eq!(order(&t, &[1, 3]), [3, 1]);

        let mut t = Tree::default();
        prio(&mut t, 5, 0, 16);
        prio(&mut t, 1, 5, 256);
        prio(&mut t, 3, 5, 1);
        for id in [1, 3, 5] {
            t.opened(id, None);
        }
        assert_eq!(order(&t, &[1, 3, 5]), [5, 1, 3]);
    }

    #[test]
    fn headers_priority_replaces_an_earlier_one() {
        let mut t = Tree::default();
        prio(&mut t, 1, 0, 16);
        prio(&mut t, 3, 0, 16);
        t.opened(1, Some((3, false, 16)));
        t.opened(3, None);
        assert_eq!(order(&t, &[1, 3]), [3, 1]);
        assert_eq!(t.nodes[&1].parent, Some(3));
    }

    #[test]
    fn a_dependency_on_a_descendant_lifts_it() {
        let mut t = Tree::default();
        prio(&mut t, 1, 0, 16);
        prio(&mut t, 3, 1, 16);
        prio(&mut t, 5, 3, 16);
        prio(&mut t, 1, 5, 16);
        // 5 took 1's place; 1 went under it; 3 stayed under 1.
        assert_eq!(t.nodes[&5].parent, Some(ROOT));
        assert_eq!(t.nodes[&1].parent, Some(5));
        assert_eq!(t.nodes[&3].parent, Some(1));
        assert_eq!(
            (t.nodes[&5].rank, t.nodes[&1].rank, t.nodes[&3].rank),
            (1, 2, 3)
        );
    }

    #[test]
    fn exclusive_takes_the_siblings() {
        let mut t = Tree::default();
        prio(&mut t, 1, 0, 16);
        prio(&mut t, 3, 1, 16);
        t.priority(5, 1, true, 16);
        assert_eq!(t.nodes[&3].parent, Some(5));
        assert_eq!(t.nodes[&1].children, [5]);
        assert_eq!(t.nodes[&3].rank, 3);
    }

    #[test]
    fn the_oldest_closed_node_goes_and_its_children_move_up() {
        let mut t = Tree::default();
        prio(&mut t, 1, 0, 16);
        prio(&mut t, 3, 1, 16);
        prio(&mut t, 5, 3, 16);
        for id in [1, 3, 5] {
            t.opened(id, None);
        }
        t.closed(3);
        for id in (7..).step_by(2).take(40) {
            t.opened(id, None);
            t.closed(id);
        }
        assert!(!t.nodes.contains_key(&3));
        assert_eq!(t.nodes[&5].parent, Some(1));
        assert_eq!(t.nodes[&5].rank, 2);
        assert!(t.closed.len() <= CLOSED_MAX);
    }

    #[test]
    fn nodes_stay_bounded() {
        let mut t = Tree::default();
        for id in (1..).step_by(2).take(3 * NODES_MAX) {
            t.opened(id, None);
        }
        assert!(t.nodes.len() <= NODES_MAX);
    }

    #[test]
    fn self_dependency_is_a_connection_error() {
        let p = Priorities::default();
        let mut frame = [0, 0, 5, 0x2, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0];
        p.priority_frame(&mut frame);
        // Now on stream 0, which the codec takes for a connection error.
        assert_eq!(frame[..9], CONNECTION_ERROR[..9]);
        let headers = [0, 0, 6, 0x1, 0x25, 0, 0, 0, 1, 0, 0, 0, 1, 15, 0x82];
        assert!(!p.request(&headers));
        let headers = [0, 0, 6, 0x1, 0x25, 0, 0, 0, 1, 0, 0, 0, 0, 15, 0x82];
        assert!(p.request(&headers));
    }
}
