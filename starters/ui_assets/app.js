// perdure's page: the goals, and one goal's task graph watched live through its event
// stream (/api/goals/ID/events, server-sent events) and steered through its messages
// endpoint. Plain ES module, no build step; everything it shows comes from the JSON API.

const main = document.getElementById("main");
const where = document.getElementById("where");

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") node.addEventListener("click", v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error((await response.json()).error || response.statusText);
  return response.json();
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

// --- the list of goals ---------------------------------------------------------------

async function showList() {
  where.textContent = "goals";
  const goals = await getJSON("/api/goals");
  const rows = goals.map((g) =>
    el("tr", {}, el("td", {}, el("a", { href: `/goals/${encodeURIComponent(g.id)}` }, g.id)),
      el("td", {}, g.status || ""), el("td", {}, g.outcome || ""), el("td", {}, g.started || "")));
  main.replaceChildren(el("table", { id: "goals" },
    el("tr", {}, el("th", {}, "goal"), el("th", {}, "status"), el("th", {}, "outcome"), el("th", {}, "started")),
    ...rows));
}

// --- one goal ------------------------------------------------------------------------

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

function drawGraph(snapshot, state) {
  const W = 170, H = 34, GX = 60, GY = 16;
  const depth = layers(snapshot.nodes);
  const columns = new Map();
  const position = new Map();
  for (const node of snapshot.nodes) {
    const d = depth.get(node.name);
    const row = columns.get(d) || 0;
    columns.set(d, row + 1);
    position.set(node.name, { x: 10 + d * (W + GX), y: 10 + row * (H + GY) });
  }
  const width = 20 + Math.max(1, columns.size) * (W + GX);
  const height = 20 + Math.max(1, ...columns.values()) * (H + GY);
  const graph = svg("svg", { id: "graph", width, height });
  for (const node of snapshot.nodes) {
    for (const need of node.needs) {
      const a = position.get(need), b = position.get(node.name);
      if (!a || !b) continue;
      graph.append(svg("path", { class: "edge", d: `M${a.x + W} ${a.y + H / 2} L${b.x} ${b.y + H / 2}` }));
    }
  }
  for (const node of snapshot.nodes) {
    const p = position.get(node.name);
    const status = state.status.get(node.name) || node.status;
    const g = svg("g", { class: `node s-${status}`, "data-node": node.name, "data-status": status });
    g.append(svg("rect", { x: p.x, y: p.y, width: W, height: H }));
    const label = svg("text", { x: p.x + 8, y: p.y + 21 });
    label.textContent = `${node.name} · ${status}`;
    g.append(label);
    g.addEventListener("click", () => showNode(snapshot, node, state));
    graph.append(g);
  }
  return graph;
}

function showNode(snapshot, node, state) {
  const detail = document.getElementById("detail");
  const status = state.status.get(node.name) || node.status;
  const reason = el("input", { id: "rewind-why", placeholder: "why this conclusion is wrong", size: "40" });
  const requestId = newRequestId();
  const rewind = el("button", { id: "rewind", onclick: async () => {
    const receipt = await send(snapshot.goal_id, { request_id: requestId, kind: "rewind", node: node.name, why: reason.value || "rewound from the page" });
    detail.append(el("p", { class: "receipt" }, `rewind: ${receipt.status || receipt.error}${receipt.note ? " · " + receipt.note : ""}`));
  } }, "rewind here");
  detail.replaceChildren(
    el("b", {}, node.name), ` · ${node.kind} · ${status}\n`,
    `tokens ${node.tokens} · $${node.cost_usd.toFixed(4)}\n`,
    Object.entries(node.placements).map(([tool, why]) => `${tool}: ${why}`).join("\n"), "\n",
    node.error ? `error: ${node.error}\n` : "", node.preview ? `output: ${node.preview}\n` : "",
    reason, rewind);
}

function drawQuestions(snapshot) {
  return snapshot.questions.map((q) => el("div", { class: "card", "data-question": q.id },
    el("b", {}, `${q.id}: ${q.title}`), el("p", {}, q.stuck),
    ...q.options.map((o) => {
      const requestId = newRequestId();
      return el("button", { "data-option": o.id, onclick: async () => {
        await send(snapshot.goal_id, { request_id: requestId, kind: "answer", question_id: q.id, choice: o.id });
      } }, o.label);
    }),
    el("p", {}, `recommended: ${q.recommendation}`)));
}

function drawSummary(snapshot) {
  const bars = Object.entries(snapshot.budget).map(([k, v]) =>
    el("div", {}, `${k} `, el("span", { class: "bar" }, el("span", { style: `width:${Math.min(100, v * 100)}%` })), ` ${Math.round(v * 100)}%`));
  const parked = snapshot.parked ? el("p", {}, `parked: ${snapshot.pause_reason || ""}${snapshot.park_expires_at ? " until " + snapshot.park_expires_at : ""}`) : "";
  return el("div", { class: "summary", id: "summary", "data-phase": snapshot.phase },
    el("b", {}, snapshot.goal_id), ` · phase ${snapshot.phase} · ${snapshot.percent_done}% · plan v${snapshot.plan_version}`,
    ` · tokens ${snapshot.tokens} · $${snapshot.cost_usd.toFixed(4)}`,
    snapshot.eta ? ` · ETA ${snapshot.eta} (${snapshot.eta_confidence})` : "", ...bars, parked);
}

async function showGoal(goalId) {
  where.textContent = goalId;
  const state = { status: new Map(), snapshot: null, refresh: null, lastRefresh: 0 };
  // The node panel is kept across renders: a reason being typed for a rewind, or its
  // receipt, must not vanish when the goal makes progress.
  const detail = el("div", { id: "detail" });
  const render = () => {
    const s = state.snapshot;
    main.replaceChildren(drawSummary(s), drawGraph(s, state), ...drawQuestions(s), detail);
  };
  const refresh = async () => {
    state.snapshot = await getJSON(`/api/goals/${encodeURIComponent(goalId)}`);
    state.status.clear(); // the snapshot is the truth; later events update it
    render();
  };
  await refresh();
  const events = new EventSource(`/api/goals/${encodeURIComponent(goalId)}/events?from=0`);
  events.addEventListener("node", (e) => {
    const data = JSON.parse(e.data);
    state.status.set(data.node, data.status);
    const node = main.querySelector(`g.node[data-node="${CSS.escape(data.node)}"]`);
    if (node) {
      node.setAttribute("class", `node s-${data.status}`);
      node.setAttribute("data-status", data.status);
      node.querySelector("text").textContent = `${data.node} · ${data.status}`;
    } else {
      scheduleRefresh(state, refresh); // a node of a new plan version
    }
  });
  for (const kind of ["plan", "question", "receipt", "progress"]) {
    events.addEventListener(kind, () => scheduleRefresh(state, refresh));
  }
  events.addEventListener("reset", () => scheduleRefresh(state, refresh)); // events were missed: re-read
  for (const kind of ["end", "closed"]) {
    events.addEventListener(kind, async () => {
      events.close(); // the goal has ended (or cannot be read): nothing more will come
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

const match = location.pathname.match(/^\/goals\/(.+)$/);
(match ? showGoal(decodeURIComponent(match[1])) : showList()).catch((err) => {
  main.replaceChildren(el("p", { class: "error" }, `error: ${err.message}`));
});
