// perdure's page: the goals, and one goal's task graph watched live through its event
// stream (/api/goals/ID/events, server-sent events) and steered through its messages
// endpoint. Plain ES module, no build step; everything it shows comes from the JSON API.
// The goal's snapshot is the truth; events update what is drawn between snapshots.

const main = document.getElementById("main");
const where = document.getElementById("where");

// Node statuses (workflows/shared/statuses.py): void work, and work given up or left out.
const VOID = new Set(["invalidated", "abandoned"]);
// What a rewind acts on (STARTED): work that ran, or started and waits.
const STARTED = new Set(["succeeded", "failed", "running", "uncertain", "blocked", "parked", "offline"]);
const CLOSED_PHASES = new Set(["finished", "failed"]);
const TAIL_CHARS = 26;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "onsubmit") node.addEventListener("submit", v);
    else if (k === "onchange") node.addEventListener("change", v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === "") continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function newRequestId() {
  return `ui-${crypto.randomUUID().replaceAll("-", "").slice(0, 16)}`;
}

// One request id per rendered button: a double click is one message, deduplicated by the goal.
async function send(goalId, message) {
  const response = await fetch(`/api/goals/${encodeURIComponent(goalId)}/messages`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(message),
  });
  return response.json();
}

function receiptText(kind, receipt) {
  return `${kind}: ${receipt.status || receipt.error}${receipt.note ? " · " + receipt.note : ""}`;
}

// A reply lands on the element the page shows now: the goal took the message before its reply
// came, so the panel it was sent from may have been drawn again meanwhile (kept in the state too,
// for the next redraw).
function showReceipt(selector, text) {
  for (const element of document.querySelectorAll(selector)) element.textContent = text;
}

// --- the list of goals ---------------------------------------------------------------

const FILTERS = ["status", "phase", "needs_human", "parked", "query"];

function filterForm(values, params) {
  const choice = (name, options, any) => el("select", { name },
    el("option", { value: "" }, any),
    ...options.map((o) => el("option", { value: o, selected: params.get(name) === o }, o)));
  const box = (name, label) => el("label", {}, el("input", { type: "checkbox", name, checked: params.get(name) === "1" }), ` ${label}`);
  return el("form", { id: "filters", onsubmit: (e) => {
    e.preventDefault();
    const data = new FormData(e.target);
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = data.get(name);
      if (value) query.set(name, value === "on" ? "1" : value);
    }
    history.pushState(null, "", query.size ? `/?${query}` : "/");
    showList().catch(showError);
  } },
    choice("status", values.statuses, "any status"), " ", choice("phase", values.phases, "any phase"), " ",
    box("needs_human", "needs an answer"), " ", box("parked", "parked"), " ",
    el("input", { name: "query", size: "42", value: params.get("query") || "", placeholder: "visibility query, e.g. PerdureCostUsd > 0.5" }), " ",
    el("button", { type: "submit" }, "filter"));
}

async function showList() {
  where.textContent = "goals";
  const params = new URLSearchParams(location.search);
  const values = await getJSON("/api/filters");
  const form = filterForm(values, params);
  let goals;
  try {
    goals = await getJSON(`/api/goals?${params}`);
  } catch (err) {
    main.replaceChildren(form, el("p", { class: "error" }, `error: ${err.message}`));
    return;
  }
  const filtered = FILTERS.some((name) => params.get(name));
  if (!goals.length) {
    main.replaceChildren(form, el("p", {}, filtered ? "no goals match these filters" : "no goals yet"));
    return;
  }
  // A goal is named by its text (ids such as goal-626ff61c59 say nothing), its id beside it.
  const rows = goals.map((g) =>
    el("tr", { "data-goal": g.id, class: g.waiting_on_you ? "waiting" : null },
      el("td", {}, el("a", { href: `/goals/${encodeURIComponent(g.id)}` }, g.goal || g.id),
        g.goal ? el("span", { class: "goal-id" }, ` ${g.id}`) : ""),
      el("td", { class: "needs-you" }, g.waiting_on_you === "answer" ? "needs your answer" : g.waiting_on_you === "parked" ? "parked" : ""),
      el("td", {}, g.status || ""), el("td", { class: `outcome o-${g.outcome || "none"}` }, g.outcome || ""),
      el("td", {}, g.phase || ""), el("td", {}, g.percent_done === null || g.percent_done === undefined ? "" : `${g.percent_done}%`),
      el("td", {}, g.cost_usd === null || g.cost_usd === undefined ? "" : `$${g.cost_usd.toFixed(4)}`),
      el("td", {}, (g.started || "").replace("T", " ").slice(0, 19))));
  main.replaceChildren(form, el("table", { id: "goals" },
    el("tr", {}, ...["goal", "", "status", "outcome", "phase", "done", "cost", "started"].map((h) => el("th", {}, h))),
    ...rows));
}

// --- one goal: the graph -------------------------------------------------------------

function layers(nodes) {
  // Depth of each node: 0 for roots, else one more than its deepest need.
  const byName = new Map(nodes.map((n) => [n.name, n]));
  const depth = new Map();
  const visit = (name, seen = new Set()) => {
    if (depth.has(name)) return depth.get(name);
    if (seen.has(name)) return 0;
    seen.add(name);
    const node = byName.get(name);
    const d = node && node.needs.length ? 1 + Math.max(...node.needs.map((n) => visit(n, seen))) : 0;
    depth.set(name, d);
    return d;
  };
  nodes.forEach((n) => visit(n.name));
  return depth;
}

// The node and everything downstream of it (by `needs`), in the graph's order.
function downstreamOf(nodes, name) {
  const dependants = new Map(nodes.map((n) => [n.name, []]));
  for (const n of nodes) for (const d of n.needs) dependants.get(d)?.push(n.name);
  const seen = new Set([name]);
  const todo = [name];
  while (todo.length) for (const child of dependants.get(todo.pop()) || []) if (!seen.has(child)) { seen.add(child); todo.push(child); }
  return nodes.filter((n) => seen.has(n.name)).map((n) => n.name);
}

// The graph of plan version `v`. The current one is the snapshot's nodes, with the work
// earlier versions left out drawn beside it (dashed). An older one is rebuilt from the
// plan events' diffs: each step as the last version that had it left it when that is
// `v` (the snapshot keeps left-out work), else only its shape (it lived on past `v`).
function versionGraph(snapshot, state, v) {
  const current = snapshot.plan_version;
  if (!v || v >= current) {
    const names = new Set(snapshot.nodes.map((n) => n.name));
    const left = new Map();
    for (const n of snapshot.earlier) if (!names.has(n.name)) left.set(n.name, n); // the latest of each
    return {
      nodes: [...snapshot.nodes.map((n) => ({ ...n, status: state.status.get(n.name) || n.status })),
        ...[...left.values()].map((n) => ({ ...n, earlier: true }))],
      note: "",
    };
  }
  // Back from the current plan: a version's steps are the next one's, less what it
  // added (unless the step was there before, changed: its older node was kept), plus
  // what it removed.
  const members = new Set(snapshot.nodes.map((n) => n.name));
  for (let k = current; k > v; k--) {
    const plan = state.plans.get(k);
    if (!plan) {
      const kept = snapshot.earlier.filter((n) => n.plan_version === v).map((n) => ({ ...n, earlier: true }));
      return { nodes: kept, note: `plan v${v}: its shape is no longer in the event stream; the work it left behind:` };
    }
    for (const name of plan.added) {
      if (!snapshot.earlier.some((n) => n.name === name && n.plan_version === k - 1)) members.delete(name);
    }
    for (const name of plan.removed) members.add(name);
  }
  const nodes = [];
  for (const name of members) {
    const older = snapshot.earlier.filter((n) => n.name === name && n.plan_version >= v)
      .sort((a, b) => a.plan_version - b.plan_version)[0];
    const node = older || snapshot.nodes.find((n) => n.name === name);
    if (!node) continue;
    const asLeft = older && older.plan_version === v;
    nodes.push({ ...node, status: asLeft ? node.status : "", shape: !asLeft });
  }
  const plan = state.plans.get(v);
  const why = plan ? ` (${plan.source}: ${plan.reason})` : "";
  return { nodes, note: `plan v${v}${why}, read-only; steps it handed on to later versions are drawn as shapes` };
}

function drawGraph(graphNodes, state, { readonly, version, onNode }) {
  const W = 160, H = 34, GX = 36, GY = 22;
  const depth = layers(graphNodes);
  const columns = new Map();
  const position = new Map();
  for (const node of graphNodes) {
    const d = depth.get(node.name);
    const row = columns.get(d) || 0;
    columns.set(d, row + 1);
    position.set(node.name, { x: 10 + d * (W + GX), y: 10 + row * (H + GY) });
  }
  const width = 20 + Math.max(1, columns.size) * (W + GX);
  const height = 20 + Math.max(1, ...columns.values()) * (H + GY);
  const graph = svg("svg", { id: "graph", width, height, "data-version": version, "data-readonly": readonly ? "true" : "false" });
  const byName = new Map(graphNodes.map((n) => [n.name, n]));
  const faded = (n) => n.earlier || VOID.has(n.status);
  for (const node of graphNodes) {
    for (const need of node.needs) {
      const a = position.get(need), b = position.get(node.name);
      if (!a || !b) continue;
      const voidEdge = faded(node) || faded(byName.get(need));
      graph.append(svg("path", { class: voidEdge ? "edge void" : "edge", d: `M${a.x + W} ${a.y + H / 2} L${b.x} ${b.y + H / 2}` }));
    }
  }
  for (const node of graphNodes) {
    const p = position.get(node.name);
    const status = node.status;
    const marked = !readonly && !node.earlier && state.wouldVoid.has(node.name);
    const classes = ["node", node.shape ? "s-shape" : `s-${status}`, node.earlier ? "earlier" : "", marked ? "would-void" : ""]
      .filter(Boolean).join(" ");
    // Only the current plan's nodes carry data-node: live events and tests find them by it.
    const attrs = node.earlier || readonly
      ? { class: classes, "data-shown-node": node.name, "data-status": status }
      : { class: classes, "data-node": node.name, "data-status": status };
    if (node.earlier) attrs["data-earlier"] = `v${node.plan_version}`;
    const g = svg("g", attrs);
    g.append(svg("rect", { x: p.x, y: p.y, width: W, height: H }));
    const label = svg("text", { x: p.x + 8, y: p.y + 21, class: "label" });
    label.textContent = node.earlier ? `${node.name} · ${status} · v${node.plan_version}` : status ? `${node.name} · ${status}` : node.name;
    g.append(label);
    const tail = svg("text", { x: p.x + 4, y: p.y + H + 13, class: "tail" });
    g.append(tail);
    g.addEventListener("click", () => onNode(node, readonly || node.earlier));
    graph.append(g);
    if (!readonly && !node.earlier) drawTail(g, state.live.get(node.name));
  }
  return graph;
}

function drawTail(g, live) {
  const tail = g.querySelector("text.tail");
  if (!tail) return;
  const text = live ? live.text.replace(/\s+/g, " ") : "";
  tail.textContent = text.length > TAIL_CHARS ? "…" + text.slice(-TAIL_CHARS) : text;
}

// --- one goal: live model output -----------------------------------------------------

// The live text of a node's latest (turn, attempt), as GoalView._reduce_live keeps it
// (workflows/goal/contracts/events.py): a later turn or attempt replaces it, an earlier one is
// dropped, a retry marker empties it. An event seen twice (by id) changes nothing.
function reduceLive(state, event) {
  if (state.seen.has(event.id)) return false;
  state.seen.add(event.id);
  const live = state.live.get(event.node);
  const later = (a, b) => a.turn > b.turn || (a.turn === b.turn && a.attempt > b.attempt);
  if (live && later(live, event)) return false;
  let next = live;
  if (!live || later(event, live) || event.type === "retry") next = { turn: event.turn, attempt: event.attempt, text: "" };
  if (event.type === "tokens") next = { ...next, text: next.text + event.text };
  state.live.set(event.node, next);
  return true;
}

function showLive(state, name) {
  const g = main.querySelector(`g.node[data-node="${CSS.escape(name)}"]`);
  if (g) drawTail(g, state.live.get(name));
  const panel = document.getElementById("live");
  if (panel && panel.dataset.node === name) {
    const live = state.live.get(name);
    panel.textContent = live ? live.text : "";
    panel.dataset.turn = live ? `${live.turn}.${live.attempt}` : "";
  }
}

// --- one goal: panels ----------------------------------------------------------------

function showNode(snapshot, node, state, readonly) {
  const detail = document.getElementById("detail");
  // The node whose detail is open, redrawn as its events arrive (a click may come before
  // the node's last event: its duration, its output).
  state.detailNode = readonly ? null : node.name;
  const event = state.nodeEvents.get(node.name);
  const status = node.status || "(shape only)";
  const duration = event && event.duration_s !== null && event.duration_s !== undefined ? ` · ${event.duration_s.toFixed(1)} s` : "";
  const placements = Object.entries(node.placements || {}).map(([tool, why]) => `${tool}: ${why}`);
  if (!placements.length && event && event.placement) placements.push(event.placement);
  const parts = [
    el("b", {}, node.name), ` · ${node.kind} · ${status}${node.earlier ? ` · left out after plan v${node.plan_version}` : ""}\n`,
    `tokens ${node.tokens} · $${node.cost_usd.toFixed(4)}${duration}\n`,
    placements.length ? `placement: ${placements.join("; ")}\n` : "",
    node.waiting_for_device ? `waiting for device ${node.waiting_for_device}\n` : "",
    node.error ? `error: ${node.error}\n` : "", node.preview ? `output: ${node.preview}\n` : "",
  ];
  const live = state.live.get(node.name);
  parts.push(el("pre", { id: "live", "data-node": node.name, "data-turn": live ? `${live.turn}.${live.attempt}` : "", class: "live" }, live ? live.text : ""));
  if (readonly) state.wouldVoid = new Set();
  if (!readonly) {
    const nodes = snapshot.nodes.map((n) => ({ ...n, status: state.status.get(n.name) || n.status }));
    const affected = downstreamOf(nodes, node.name);
    const statusOf = new Map(nodes.map((n) => [n.name, n.status]));
    const ran = affected.filter((n) => STARTED.has(statusOf.get(n)));
    const waits = affected.filter((n) => !STARTED.has(statusOf.get(n)));
    // Kept in the state: the graph is redrawn as the goal moves, the marks with it.
    state.wouldVoid = new Set(affected);
    main.querySelectorAll("g.node[data-node]").forEach((g) => g.classList.toggle("would-void", state.wouldVoid.has(g.dataset.node)));
    const preview = el("p", { id: "rewind-preview", "data-void": ran.join(" ") },
      `rewind here makes void: ${ran.map((n) => `${n} (${statusOf.get(n)})`).join(", ") || "nothing that has run"}; it runs again`,
      waits.length ? `; not run yet, waits for it: ${waits.join(", ")}` : "");
    const reason = el("input", { id: "rewind-why", placeholder: "why this conclusion is wrong", size: "40" });
    const requestId = newRequestId();
    const rewind = el("button", { id: "rewind", onclick: async () => {
      const receipt = await send(snapshot.goal_id, { request_id: requestId, kind: "rewind", node: node.name, why: reason.value || "rewound from the page" });
      state.noteReceipt(receipt);
      // Kept in the state: the rewind's own node events redraw this detail right after.
      state.rewound.set(node.name, receiptText("rewind", receipt));
      detail.querySelector(".receipt")?.remove();
      detail.append(el("p", { class: "receipt" }, state.rewound.get(node.name)));
    } }, "rewind here");
    parts.push(preview, reason, " ", rewind);
    if (state.rewound.has(node.name)) parts.push(el("p", { class: "receipt" }, state.rewound.get(node.name)));
  }
  detail.replaceChildren(...parts);
}

// What a card says is done comes with each snapshot: it is what is done now, not when asked.
function drawQuestions(snapshot, state) {
  return snapshot.questions.map((q) => (q.ahead || []).length ? drawAheadCard(snapshot, q, state) : el("div", { class: "card", "data-question": q.id },
    el("b", {}, `${q.id}: ${q.title}`), el("p", { class: "done-so-far" }, `done so far: ${q.done}`), el("p", {}, q.stuck),
    ...q.options.map((o) => {
      const requestId = newRequestId();
      return el("button", { "data-option": o.id, title: o.cost || "", onclick: async () => {
        await send(snapshot.goal_id, { request_id: requestId, kind: "answer", question_id: q.id, choice: o.id });
      } }, o.label);
    }),
    el("p", {}, `recommended: ${q.recommendation}`), ...drawDeadline(q)));
}

// When the card expires unanswered and what it decides then; its reminder, once sent, says so.
function drawDeadline(q) {
  if (!q.deadline_at) return [];
  const reminded = q.reminded_at ? ` · reminded ${q.reminded_at}` : "";
  const expired = q.expired_at ? ` · expired ${q.expired_at}: the goal parked, answer it and resume` : "";
  return [el("p", { class: q.reminded_at || q.expired_at ? "deadline reminded" : "deadline" },
    `deadline ${q.deadline_at} · on expiry: ${q.on_expiry}${reminded}${expired}`)];
}

// An abort: requested (what still runs, what is still to undo), then aborted (what was undone
// and what could not be, and why); the same lines `perdure status` prints (starters/render_abort.py).
function drawAbort(abort) {
  if (!abort) return "";
  const by = abort.by ? ` by ${abort.by}` : "";
  const head = abort.stage === "requested"
    ? `abort requested ${abort.requested_at || ""}${by}`
    : `aborted ${abort.achieved_at || ""} (requested ${abort.requested_at || ""}${by})`;
  const tail = abort.emergency ? " · emergency stop: the plan's wrap-up steps still run" : "";
  const step = (label, s) => el("li", { "data-node": s.node, "data-list": label },
    `${label}: ${s.node} (${s.tools.join(", ") || s.kind})${s.note ? `: ${s.note}` : ""}`);
  const effect = (label, e) => {
    const made = `${e.node} · ${e.tool || "its write"}`;
    const text = ["pending", "running"].includes(e.status) ? `${made} by ${e.undo} (${e.status})${e.why ? `: ${e.why}` : ""}`
      : e.status === "done" ? `${made} by ${e.undo}${e.why ? ` (${e.why})` : ""}` : `${made}: ${e.why || e.status}`;
    return el("li", { "data-node": e.node, "data-list": label, "data-status": e.status }, `${label}: ${text}`);
  };
  const items = [
    ...abort.running.map((s) => step("still running", s)), ...abort.stopped.map((s) => step("stopped", s)),
    ...abort.to_undo.map((e) => effect("to undo", e)), ...abort.undone.map((e) => effect("undone", e)),
    ...abort.not_undone.map((e) => effect("not undone", e)),
  ];
  if (abort.stage === "achieved" && !items.length) items.push(el("li", {}, "nothing was running or left to undo"));
  return el("div", { id: "abort", class: `abort ${abort.stage}`, "data-stage": abort.stage },
    el("b", {}, `${head} · rollback: ${abort.rollback ? "yes" : "no"} · ${abort.reason}${tail}`), el("ul", {}, ...items));
}

// The buttons of an approvals-ahead card (workflows/goal/rules/questions.py): whether each names the ticked steps.
const AHEAD_BUTTONS = [["approve", "approve all", false], ["approve_some", "approve checked", true],
  ["refuse_some", "refuse checked", true], ["reject", "refuse all", false]];

// An approvals-ahead card: a checkbox per step it lists. What is ticked, and the answer's
// receipt, are kept in the state: the card is redrawn as the goal moves on meanwhile.
function drawAheadCard(snapshot, q, state) {
  if (!state.picked.has(q.id)) state.picked.set(q.id, new Set());
  const picked = state.picked.get(q.id);
  const steps = q.ahead.map((a) => el("label", { class: "ahead-step", "data-step": a.step },
    el("input", { type: "checkbox", "data-step": a.step, checked: picked.has(a.step),
      onchange: (e) => { if (e.target.checked) picked.add(a.step); else picked.delete(a.step); } }),
    " ", el("b", {}, a.step), ` · ${a.tool} `, el("code", {}, a.arguments), a.on ? ` on ${a.on}` : "",
    a.digest ? "" : el("i", {}, " will ask when known"),
    a.approved_before ? el("span", { class: "approved-before" }, ` · approved before as ${a.approved_before}`) : ""));
  const receipt = el("p", { class: "receipt" }, state.answers.get(q.id) || "");
  const buttons = AHEAD_BUTTONS.filter(([id]) => q.options.some((o) => o.id === id)).map(([id, label, named]) =>
    el("button", { "data-option": id, title: q.options.find((o) => o.id === id).label, onclick: async () => {
      const chosen = named ? q.ahead.map((a) => a.step).filter((s) => picked.has(s)) : [];
      // One request id per card, choice and ticked steps: a double click is one message.
      const key = `${q.id} ${id} ${chosen.join(",")}`;
      if (!state.requestIds.has(key)) state.requestIds.set(key, newRequestId());
      const message = { request_id: state.requestIds.get(key), kind: "answer", question_id: q.id, choice: id };
      const answer = await send(snapshot.goal_id, named ? { ...message, steps: chosen } : message);
      state.noteReceipt(answer);
      state.answers.set(q.id, receiptText("answer", answer));
      showReceipt(`[data-question="${q.id}"] .receipt`, state.answers.get(q.id));
    } }, label));
  return el("div", { class: "card ahead", "data-question": q.id },
    el("b", {}, `${q.id}: ${q.title}`), el("p", { class: "done-so-far" }, `done so far: ${q.done}`),
    el("p", {}, "These steps wait for a person (they cannot be undone, or run where a person approves each call). Approved now, each runs later without asking again if its call is still exactly this:"),
    el("div", { class: "ahead-steps" }, ...steps), ...buttons, receipt,
    el("p", {}, `recommended: ${q.recommendation}`), ...drawDeadline(q));
}

function drawSummary(snapshot) {
  const bars = Object.entries(snapshot.budget).map(([k, v]) =>
    el("div", {}, `${k} `, el("span", { class: "bar" }, el("span", { style: `width:${Math.min(100, v * 100)}%` })), ` ${Math.round(v * 100)}%`));
  const parked = snapshot.parked ? el("p", { id: "parked" }, `parked: ${snapshot.pause_reason || ""}${snapshot.park_expires_at ? " until " + snapshot.park_expires_at : ""}`) : "";
  const failure = snapshot.failure ? el("p", { class: "error" }, `failure: ${snapshot.failure}`) : "";
  const expired = (snapshot.expired_questions || []).map((line) => el("p", { class: "expired" }, `expired: ${line}`));
  return el("div", { class: "summary", id: "summary", "data-phase": snapshot.phase },
    el("b", { class: "goal-text" }, snapshot.goal || snapshot.goal_id), snapshot.goal ? el("span", { class: "goal-id" }, ` ${snapshot.goal_id}`) : "",
    ` · phase ${snapshot.phase} · ${snapshot.percent_done}% · plan v${snapshot.plan_version}`,
    ` · tokens ${snapshot.tokens} · $${snapshot.cost_usd.toFixed(4)}`,
    snapshot.eta ? ` · ETA ${snapshot.eta}${snapshot.eta.includes("confidence") ? "" : ` (${snapshot.eta_confidence})`}` : "", ...bars, parked, ...expired,
    drawAbort(snapshot.abort), failure);
}

function drawInbox(box, state) {
  const rows = [...state.receipts.values()].map((r) =>
    el("tr", { "data-request": r.request_id, "data-status": r.status },
      el("td", {}, r.kind), el("td", { class: `r-${r.status}` }, r.status), el("td", {}, r.note || ""), el("td", { class: "rid" }, r.request_id)));
  box.replaceChildren(el("h3", {}, "inbox"),
    rows.length ? el("table", {}, el("tr", {}, ...["kind", "status", "note", "request id"].map((h) => el("th", {}, h))), ...rows)
      : el("p", {}, "no messages yet"),
    state.refused ? el("p", { class: "error" }, `${state.refused} refused at the door (see perdure inbox)`) : "");
}

function drawPremises(box, snapshot, state) {
  const entries = Object.entries(snapshot.premises);
  const why = el("input", { id: "narrow-why", placeholder: "why the requirement changed", size: "30" });
  const answer = el("p", { class: "narrow-receipt" }, state.narrowReceipt || "");
  const rows = entries.map(([key, value]) => {
    const input = el("input", { name: key, value, size: "16" });
    const requestId = newRequestId();
    return el("div", { class: "premise", "data-premise": key, "data-value": value },
      el("code", {}, `${key} = ${value}`), " ", input, " ",
      el("button", { onclick: async () => {
        const receipt = await send(snapshot.goal_id, { request_id: requestId, kind: "narrow", premises: { [key]: input.value }, why: why.value || null });
        state.noteReceipt(receipt);
        state.narrowReceipt = receiptText("narrow", receipt);
        showReceipt(".narrow-receipt", state.narrowReceipt);
      } }, "narrow"));
  });
  box.replaceChildren(el("h3", {}, "premises"),
    ...(entries.length ? [...rows, why, answer] : [el("p", {}, "this goal rests on no named premises")]));
}

// Park (for a time, or until a workspace file exists, a command exits 0 or a named signal
// arrives), resume, and send the signal a park waits for. Redrawn only when the goal parks or
// resumes, so a reason being typed stays.
function drawPark(box, snapshot, state) {
  const answer = el("p", { class: "park-receipt" }, state.parkReceipt || "");
  const sent = (kind) => (receipt) => {
    state.noteReceipt(receipt);
    state.parkReceipt = receiptText(kind, receipt);
    showReceipt(".park-receipt", state.parkReceipt);
  };
  if (snapshot.parked) {
    const waitsFor = /until signal ([^ );]+)/.exec(snapshot.pause_reason || "");
    const resumeId = newRequestId();
    const signalId = newRequestId();
    box.replaceChildren(el("h3", {}, "park"), el("p", {}, `parked: ${snapshot.pause_reason || ""}`),
      el("button", { id: "resume", onclick: async () =>
        sent("resume")(await send(snapshot.goal_id, { request_id: resumeId, kind: "resume" })) }, "resume"), " ",
      waitsFor ? el("button", { id: "send-signal", "data-signal": waitsFor[1], onclick: async () =>
        sent("signal")(await send(snapshot.goal_id, { request_id: signalId, kind: "signal", name: waitsFor[1] })) },
        `send signal ${waitsFor[1]}`) : "",
      answer);
    return;
  }
  const reason = el("input", { id: "park-reason", placeholder: "what the goal waits for", size: "24" });
  const until = el("select", { id: "park-until" },
    ...[["", "until resumed"], ["until_file", "until a file exists"], ["until_command", "until a command exits 0"],
      ["until_signal", "until a signal"]].map(([v, label]) => el("option", { value: v }, label)));
  const target = el("input", { id: "park-target", placeholder: "path, command or signal name", size: "24" });
  const requestId = newRequestId();
  const park = el("button", { id: "park", onclick: async () => {
    const message = { request_id: requestId, kind: "park", reason: reason.value || "parked from the page" };
    if (until.value) message[until.value] = target.value;
    sent("park")(await send(snapshot.goal_id, message));
  } }, "park");
  box.replaceChildren(el("h3", {}, "park"), reason, " ", until, " ", target, " ", park, answer);
}

// The decision log (`perdure log`): every decision in order, the latest at the bottom, and
// what could not be read (no worker, a chunk in a store this server does not see).
function drawDecisions(box, read) {
  const rows = read.entries.map((d) => el("tr", { "data-seq": d.seq, "data-kind": d.kind },
    el("td", {}, d.seq), el("td", {}, d.at.replace("T", " ").slice(0, 19)), el("td", { class: `k-${d.kind}` }, d.kind),
    el("td", {}, d.who), el("td", {}, d.text), el("td", {}, d.about.join(", "))));
  const scroll = el("div", { class: "scroll" },
    el("table", {}, el("tr", {}, ...["#", "at (UTC)", "kind", "who", "decision", "steps"].map((h) => el("th", {}, h))), ...rows));
  box.replaceChildren(el("h3", {}, `decisions · ${read.count}`),
    rows.length ? scroll : el("p", {}, "no decisions yet"),
    ...read.notes.map((note) => el("p", { class: "note" }, note)));
  scroll.scrollTop = scroll.scrollHeight;
}

async function loadDecisions(box, goalId) {
  try {
    drawDecisions(box, await getJSON(`/api/goals/${encodeURIComponent(goalId)}/decisions`));
  } catch (err) {
    box.replaceChildren(el("h3", {}, "decisions"), el("p", { class: "error" }, err.message));
  }
}

async function loadReport(box, goalId, tries = 0) {
  try {
    const report = await getJSON(`/api/goals/${encodeURIComponent(goalId)}/report`);
    box.replaceChildren(el("h3", {}, `report · ${report.outcome}`),
      report.failure ? el("p", { class: "error" }, report.failure) : "",
      report.unfinished.length ? el("p", {}, `unfinished: ${report.unfinished.join("; ")}`) : "",
      el("pre", { id: "report-text" }, report.report));
  } catch (err) {
    // The goal publishes its end a moment before its run closes: ask again shortly.
    if (err.status === 409 && tries < 20) setTimeout(() => loadReport(box, goalId, tries + 1), 500);
    else box.replaceChildren(el("h3", {}, "report"), el("p", { class: "error" }, err.message));
  }
}

// --- one goal ------------------------------------------------------------------------

async function showGoal(goalId) {
  where.textContent = goalId;
  const api = `/api/goals/${encodeURIComponent(goalId)}`;
  const state = {
    status: new Map(), nodeEvents: new Map(), live: new Map(), seen: new Set(), plans: new Map(),
    receipts: new Map(), rewound: new Map(), refused: 0, snapshot: null, view: null, refresh: null, lastRefresh: 0,
    premises: null, parkedAs: null, reported: false, wouldVoid: new Set(), picked: new Map(), answers: new Map(), requestIds: new Map(),
  };
  // The panels are kept across renders: a reason or a premise value being typed, or a
  // receipt, must not vanish when the goal makes progress.
  const detail = el("div", { id: "detail" }, "click a node for its detail");
  const inbox = el("section", { id: "inbox", class: "panel" });
  const premises = el("section", { id: "premises", class: "panel" });
  const parking = el("section", { id: "parking", class: "panel" });
  const report = el("section", { id: "report", class: "panel" });
  const decisions = el("section", { id: "decisions", class: "panel" });
  const graphBox = el("div", { id: "graph-box" });
  const questions = el("div", { id: "questions" });
  state.noteReceipt = (receipt) => {
    if (receipt && receipt.request_id && receipt.status) state.receipts.set(receipt.request_id, receipt);
    drawInbox(inbox, state);
  };

  const picker = el("select", { id: "plan-version", onchange: () => {
    const v = Number(picker.value);
    state.view = v >= state.snapshot.plan_version ? null : v;
    drawCurrentGraph();
  } });
  const versionNote = el("span", { id: "version-note" });

  const drawCurrentGraph = () => {
    const s = state.snapshot;
    const shown = versionGraph(s, state, state.view);
    versionNote.textContent = shown.note;
    const readonly = state.view !== null;
    graphBox.replaceChildren(drawGraph(shown.nodes, state, {
      readonly, version: state.view || s.plan_version, onNode: (node, ro) => showNode(s, node, state, ro),
    }));
  };

  const summary = el("div", { id: "summary-box" });
  const render = () => {
    const s = state.snapshot;
    summary.replaceChildren(drawSummary(s));
    if (state.view !== null && state.view >= s.plan_version) state.view = null;
    const chosen = state.view || s.plan_version;
    picker.replaceChildren(...Array.from({ length: s.plan_version }, (_, i) => i + 1).map((v) =>
      el("option", { value: v, selected: v === chosen }, v === s.plan_version ? `plan v${v} (current)` : `plan v${v}`)));
    drawCurrentGraph();
    questions.replaceChildren(...drawQuestions(s, state));
    const premisesNow = JSON.stringify(s.premises);
    if (premisesNow !== state.premises) {
      state.premises = premisesNow;
      drawPremises(premises, s, state);
    }
    const parkedNow = CLOSED_PHASES.has(s.phase) ? "closed" : `${s.parked}:${s.pause_reason}`;
    if (parkedNow !== state.parkedAs) {
      state.parkedAs = parkedNow;
      if (CLOSED_PHASES.has(s.phase)) parking.replaceChildren();
      else drawPark(parking, s, state);
    }
    if (CLOSED_PHASES.has(s.phase) && !state.reported) {
      state.reported = true;
      loadReport(report, goalId);
    }
  };
  const refresh = async () => {
    state.snapshot = await getJSON(api);
    state.status.clear(); // the snapshot is the truth; later events update it
    if (state.snapshot.goal) where.textContent = `${state.snapshot.goal} · ${goalId}`;
    render();
    loadDecisions(decisions, goalId); // decisions come with plans, answers, gates: re-read with the snapshot
  };
  const refreshInbox = async () => {
    const view = await getJSON(`${api}/inbox`);
    for (const r of view.entries) state.receipts.set(r.request_id, r);
    state.refused = view.refused.length;
    drawInbox(inbox, state);
  };

  await refresh();
  await refreshInbox().catch(() => drawInbox(inbox, state));
  main.replaceChildren(summary, questions,
    el("div", { class: "layout" },
      el("div", { class: "left" }, el("div", { class: "versions" }, picker, " ", versionNote), graphBox, detail),
      el("div", { class: "right" }, inbox, parking, premises)),
    decisions, report);

  const events = new EventSource(`${api}/events?from=0`);
  events.addEventListener("node", (e) => {
    const data = JSON.parse(e.data);
    state.status.set(data.node, data.status);
    state.nodeEvents.set(data.node, data);
    if (data.status !== "running" && state.live.delete(data.node)) showLive(state, data.node); // its output is the node's now
    const node = state.view === null ? main.querySelector(`g.node[data-node="${CSS.escape(data.node)}"]`) : null;
    if (node) {
      node.setAttribute("class", `node s-${data.status}${state.wouldVoid.has(data.node) ? " would-void" : ""}`);
      node.setAttribute("data-status", data.status);
      node.querySelector("text.label").textContent = `${data.node} · ${data.status}`;
    }
    if (!node || VOID.has(data.status)) scheduleRefresh(state, refresh); // a node of a new plan version, or a void path
    const open = state.view === null && state.detailNode === data.node
      ? state.snapshot.nodes.find((n) => n.name === data.node) : null;
    if (open) showNode(state.snapshot, { ...open, status: data.status }, state, false);
  });
  for (const kind of ["tokens", "retry"]) {
    events.addEventListener(kind, (e) => {
      const data = JSON.parse(e.data);
      if (reduceLive(state, data)) showLive(state, data.node);
    });
  }
  events.addEventListener("plan", (e) => {
    const data = JSON.parse(e.data);
    state.plans.set(data.version, data);
    scheduleRefresh(state, refresh);
  });
  events.addEventListener("receipt", (e) => {
    const data = JSON.parse(e.data);
    state.noteReceipt({ request_id: data.request_id, kind: data.kind, status: data.status, note: data.note });
    scheduleRefresh(state, refresh);
  });
  for (const kind of ["question", "progress", "abort"]) {
    events.addEventListener(kind, () => scheduleRefresh(state, refresh));
  }
  events.addEventListener("reset", () => scheduleRefresh(state, refresh)); // events were missed: re-read
  for (const kind of ["end", "closed"]) {
    events.addEventListener(kind, async () => {
      events.close(); // the goal has ended (or cannot be read): nothing more will come
      state.live.clear();
      await refresh();
    });
  }
}

// At most one snapshot a second: on a goal of thousands of nodes a snapshot is megabytes.
function scheduleRefresh(state, refresh) {
  clearTimeout(state.refresh);
  const wait = Math.max(150, 1000 - (Date.now() - state.lastRefresh));
  state.refresh = setTimeout(() => { state.lastRefresh = Date.now(); refresh(); }, wait);
}

function showError(err) {
  main.replaceChildren(el("p", { class: "error" }, `error: ${err.message}`));
}

window.addEventListener("popstate", () => { if (location.pathname === "/") showList().catch(showError); });

const match = location.pathname.match(/^\/goals\/(.+)$/);
(match ? showGoal(decodeURIComponent(match[1])) : showList()).catch(showError);
