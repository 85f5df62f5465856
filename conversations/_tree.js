"use strict";
(function () {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const XMLNS_NS = "http://www.w3.org/2000/xmlns/";
  const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2",
                   "#9c755f", "#d37295", "#edc948", "#bab0ac", "#1f77b4", "#8c564b"];
  const DX = 30, DY = 44, R = 8, PAD = 40, MAX_K = 8;
  const KNOWN = new Set(["id", "parentId", "role", "content", "timestamp", "branchId",
                         "children"]);
  const $ = (id) => document.getElementById(id);
  const svgEl = (name, attrs) => {
    const el = document.createElementNS(SVG_NS, name);
    if (attrs) for (const k in attrs) el.setAttribute(k, String(attrs[k]));
    return el;
  };
  const asArray = (v) => (Array.isArray(v) ? v : []);
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  const pretty = (v) => (typeof v === "string" ? v : JSON.stringify(v, null, 2));

  const data = JSON.parse($("tree-data").textContent);
  const tree = data.tree;
  const svg = $("tree");
  const viewport = $("viewport");
  const style = svgEl("style");
  style.textContent = @@SVG_CSS@@;
  svg.insertBefore(style, svg.firstChild);

  // ---- branches and their colours --------------------------------------------------------
  const branches = asArray(tree.branches);
  const branchById = new Map();
  const colourOf = new Map();
  for (const b of branches) {
    if (b && !branchById.has(b.id)) {
      branchById.set(b.id, b);
      colourOf.set(b.id, PALETTE[colourOf.size % PALETTE.length]);
    }
  }
  const colour = (bid) => {
    if (!colourOf.has(bid)) colourOf.set(bid, PALETTE[colourOf.size % PALETTE.length]);
    return colourOf.get(bid);
  };
  const branchLabel = (bid) => {
    const b = branchById.get(bid);
    return b ? str(b.name) + " (#" + str(b.number) + ")" : str(bid);
  };

  // ---- nodes: Python sent them flat, in pre-order, with each one's parent index ---------
  const nodes = [];      // {msg, parent, depth, kids: [], x, y, el, text}
  const byId = new Map();
  const flat = asArray(data.nodes), parents = asArray(data.parents);
  for (let i = 0; i < flat.length; i++) {
    const msg = flat[i], parent = parents[i];
    const depth = parent >= 0 ? nodes[parent].depth + 1 : 0;
    nodes.push({msg: msg, parent: parent, depth: depth, kids: [], x: 0, y: depth * DY,
                el: null, text: null});
    if (parent >= 0) nodes[parent].kids.push(i);
    if (!byId.has(str(msg.id))) byId.set(str(msg.id), i);
  }

  // ---- tidy layout: leaves in consecutive slots, parents centred over their children ----
  let slot = 0;
  for (const n of nodes) if (n.kids.length === 0) n.x = (slot++) * DX;
  for (let i = nodes.length - 1; i >= 0; i--) {
    const n = nodes[i];
    if (n.kids.length) n.x = (nodes[n.kids[0]].x + nodes[n.kids[n.kids.length - 1]].x) / 2;
  }
  let minX = 0, maxX = 0, maxY = 0;
  for (const n of nodes) {
    if (n.x > maxX) maxX = n.x;
    if (n.y > maxY) maxY = n.y;
  }
  const bounds = {x: minX - PAD, y: -PAD, w: maxX - minX + 2 * PAD, h: maxY + 2 * PAD};

  // ---- active leaf and its path to the root ---------------------------------------------
  const onPath = new Set();
  const activeIndex = byId.has(str(tree.activeLeafId)) ? byId.get(str(tree.activeLeafId)) : -1;
  for (let i = activeIndex; i >= 0; i = nodes[i].parent) onPath.add(i);

  // ---- draw ------------------------------------------------------------------------------
  const edgeD = new Map();  // branch id -> path segments
  const pathD = [], mergeD = [];
  const seg = (a, b) => {
    const my = (a.y + b.y) / 2;
    return "M" + a.x + " " + a.y + "C" + a.x + " " + my + " " + b.x + " " + my + " " +
      b.x + " " + b.y;
  };
  for (let i = 0; i < nodes.length; i++) {
    const n = nodes[i];
    if (n.parent >= 0) {
      const s = seg(nodes[n.parent], n);
      if (onPath.has(i)) pathD.push(s);
      const bid = str(n.msg.branchId);
      if (!edgeD.has(bid)) edgeD.set(bid, []);
      edgeD.get(bid).push(s);
    }
    const from = n.msg.mergedFrom;
    if (from !== undefined && from !== null && byId.has(str(from))) {
      mergeD.push(seg(nodes[byId.get(str(from))], n));
    }
  }
  const edges = svgEl("g", {"class": "edges"});
  for (const [bid, parts] of edgeD) {
    edges.appendChild(svgEl("path", {"class": "branch-edges", "data-branch": bid,
                                     stroke: colour(bid), d: parts.join("")}));
  }
  if (mergeD.length) edges.appendChild(svgEl("path", {"class": "merge-edges",
                                                      d: mergeD.join("")}));
  if (pathD.length) edges.appendChild(svgEl("path", {"class": "active-path",
                                                     d: pathD.join("")}));
  const layer = svgEl("g", {"class": "nodes"});
  const ROLE_MARK = {user: "U", assistant: "A", system: "S", tool: "T"};
  for (let i = 0; i < nodes.length; i++) {
    const n = nodes[i], m = n.msg;
    const role = str(m.role);
    const g = svgEl("g", {"class": "node", "data-id": str(m.id), "data-index": i,
                          "data-branch": str(m.branchId), "data-role": role,
                          transform: "translate(" + n.x + " " + n.y + ")"});
    if (onPath.has(i)) g.classList.add("on-path");
    if (i === activeIndex) g.classList.add("active-leaf");
    g.appendChild(svgEl("circle", {"class": "halo", r: R + 5}));
    g.appendChild(svgEl("circle", {"class": "dot", r: R, fill: colour(str(m.branchId))}));
    const mark = svgEl("text");
    mark.textContent = ROLE_MARK[role] || (role.charAt(0).toUpperCase() || "?");
    g.appendChild(mark);
    const tip = svgEl("title");
    const body = pretty(m.content);
    tip.textContent = role + ": " + (body && body.length > 120 ? body.slice(0, 119) + "\u2026"
                                                                : str(body));
    g.appendChild(tip);
    n.el = g;
    layer.appendChild(g);
  }
  viewport.appendChild(edges);
  viewport.appendChild(layer);

  // ---- legend and stats ------------------------------------------------------------------
  $("stats").textContent = nodes.length + (nodes.length === 1 ? " message" : " messages") +
    " \u00b7 " + colourOf.size + (colourOf.size === 1 ? " branch" : " branches");
  const legend = $("legend");
  const legendItem = (bid, text, current, leafId) => {
    const li = document.createElement("li");
    li.className = "legend-item" + (current ? " current" : "");
    li.dataset.branchId = bid;
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.backgroundColor = colour(bid);
    const label = document.createElement("span");
    label.textContent = text;
    li.append(sw, label);
    li.addEventListener("click", () => {
      const i = byId.get(str(leafId));
      if (i !== undefined) { select(i); centreOn(i); }
    });
    legend.appendChild(li);
  };
  for (const b of branchById.values()) {
    const count = b.messageCount === undefined ? "" : " \u2014 " + str(b.messageCount) +
      (b.messageCount === 1 ? " message" : " messages");
    const current = b.current === true || (tree.currentBranchId !== undefined &&
                                           b.id === tree.currentBranchId);
    legendItem(str(b.id), "#" + str(b.number) + " " + str(b.name) + count +
               (current ? " (current)" : ""), current, b.leafId);
    if (b.sessionId) legend.lastChild.classList.add("agent");
  }
  for (const bid of colourOf.keys()) {
    if (!branchById.has(bid)) legendItem(bid, bid || "(no branch)", false, null);
  }

  // ---- detail panel ----------------------------------------------------------------------
  let selected = -1;
  function select(i) {
    if (selected >= 0) nodes[selected].el.classList.remove("selected");
    selected = i;
    const n = nodes[i], m = n.msg;
    n.el.classList.add("selected");
    $("detail-hint").hidden = true;
    $("detail-body").hidden = false;
    $("detail-role").textContent = str(m.role);
    $("detail-timestamp").textContent = str(m.timestamp);
    $("detail-branch").textContent = branchLabel(str(m.branchId));
    $("detail-id").textContent = str(m.id);
    $("detail-parent").textContent = m.parentId === null || m.parentId === undefined
      ? "(none: a root)" : str(m.parentId);
    showSession(m);
    $("detail-content").textContent = pretty(m.content === undefined ? null : m.content);
    const extra = {};
    let any = false;
    for (const k of Object.keys(m)) if (!KNOWN.has(k)) { extra[k] = m[k]; any = true; }
    $("detail-extra").textContent = any ? JSON.stringify(extra, null, 2) : "";
    $("detail-extra-title").hidden = !any;
    $("detail-extra").hidden = !any;
  }

  // A message a sub-agent wrote (its branch is the sub-agent's context) or one that
  // reports a sub-agent's result names that session: kind, skill, state and a link.
  const sessions = (tree.sessions && typeof tree.sessions === "object") ? tree.sessions : {};
  const sessionOf = (m) => {
    if (m.sessionId) return str(m.sessionId);
    const b = branchById.get(str(m.branchId));
    return b && b.sessionId ? str(b.sessionId) : "";
  };
  function showSession(m) {
    const cell = $("detail-session");
    cell.textContent = "";
    const sid = sessionOf(m);
    if (!sid) { cell.textContent = "(a person, or the Main)"; return; }
    const s = sessions[sid];
    const link = document.createElement("a");
    link.id = "detail-session-link";
    link.textContent = s ? str(s.kind) + " " + str(s.skill) + " \u2014 " + str(s.state) : sid;
    link.title = sid;
    if (s && s.url) link.href = str(s.url);
    cell.appendChild(link);
  }

  // ---- zoom and pan ----------------------------------------------------------------------
  let k = 1, tx = 0, ty = 0, minK = 0.02;
  const apply = () => {
    viewport.setAttribute("transform", "translate(" + tx + " " + ty + ") scale(" + k + ")");
  };
  const size = () => {
    const r = svg.getBoundingClientRect();
    return {w: r.width || 800, h: r.height || 600};
  };
  const zoomAt = (factor, px, py) => {
    const nk = Math.min(MAX_K, Math.max(minK, k * factor));
    tx = px - (px - tx) * (nk / k);
    ty = py - (py - ty) * (nk / k);
    k = nk;
    apply();
  };
  const zoomCentre = (factor) => { const s = size(); zoomAt(factor, s.w / 2, s.h / 2); };
  function centreOn(i) {
    const s = size();
    tx = s.w / 2 - nodes[i].x * k;
    ty = s.h / 2 - nodes[i].y * k;
    apply();
  }
  const fit = () => {
    const s = size();
    const f = Math.min(s.w / bounds.w, s.h / bounds.h);
    minK = Math.min(0.02, f * 0.5);
    return f;
  };
  const showAll = () => {
    const s = size();
    k = Math.min(1.5, fit());
    tx = (s.w - bounds.w * k) / 2 - bounds.x * k;
    ty = (s.h - bounds.h * k) / 2 - bounds.y * k;
    apply();
  };
  const resetView = () => {
    // The whole tree when it stays legible; otherwise the active leaf (or the first
    // message) at scale 1, and the user zooms out for the overview.
    if (fit() >= 0.35 || nodes.length === 0) { showAll(); return; }
    k = 1;
    centreOn(activeIndex >= 0 ? activeIndex : 0);
  };
  $("zoom-in").addEventListener("click", () => zoomCentre(1.25));
  $("zoom-out").addEventListener("click", () => zoomCentre(0.8));
  $("zoom-reset").addEventListener("click", resetView);
  $("zoom-fit").addEventListener("click", showAll);
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const unit = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? size().h : 1;
    const r = svg.getBoundingClientRect();
    zoomAt(Math.exp(-e.deltaY * unit * 0.0015), e.clientX - r.left, e.clientY - r.top);
  }, {passive: false});

  let drag = null, suppressClick = false;
  svg.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    suppressClick = false;
    drag = {x: e.clientX, y: e.clientY, tx: tx, ty: ty, moved: false};
  });
  window.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
    if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
    drag.moved = true;
    svg.classList.add("dragging");
    tx = drag.tx + dx;
    ty = drag.ty + dy;
    apply();
  });
  const endDrag = () => {
    if (drag && drag.moved) suppressClick = true;
    drag = null;
    svg.classList.remove("dragging");
  };
  window.addEventListener("pointerup", endDrag);
  window.addEventListener("pointercancel", endDrag);
  svg.addEventListener("click", (e) => {
    if (suppressClick) { suppressClick = false; return; }
    const g = e.target instanceof Element ? e.target.closest("g.node") : null;
    if (g) select(Number(g.getAttribute("data-index")));
  });

  // ---- search ----------------------------------------------------------------------------
  let matches = [], cursor = -1;
  const textOf = (n) => {
    if (n.text === null) {
      const c = n.msg.content;
      n.text = (typeof c === "string" ? c : c === undefined ? "" : JSON.stringify(c))
        .toLowerCase();
    }
    return n.text;
  };
  const search = $("search"), count = $("match-count");
  const showCount = () => {
    count.dataset.count = String(matches.length);
    if (search.value === "") count.textContent = "";
    else if (cursor >= 0) count.textContent = (cursor + 1) + " / " + matches.length;
    else count.textContent = matches.length + (matches.length === 1 ? " match" : " matches");
  };
  search.addEventListener("input", () => {
    for (const i of matches) nodes[i].el.classList.remove("match");
    matches = [];
    cursor = -1;
    const q = search.value.toLowerCase();
    if (q !== "") {
      for (let i = 0; i < nodes.length; i++) {
        if (textOf(nodes[i]).includes(q)) { matches.push(i); nodes[i].el.classList.add("match"); }
      }
    }
    showCount();
  });
  search.addEventListener("keydown", (e) => {
    if (e.key !== "Enter" || matches.length === 0) return;
    e.preventDefault();
    const step = e.shiftKey ? -1 : 1;
    cursor = cursor < 0 ? (step > 0 ? 0 : matches.length - 1)
                        : (cursor + step + matches.length) % matches.length;
    select(matches[cursor]);
    centreOn(matches[cursor]);
    showCount();
  });

  // ---- download as a standalone SVG ------------------------------------------------------
  $("print").addEventListener("click", () => window.print());
  $("download-svg").addEventListener("click", () => {
    const copy = svg.cloneNode(true);
    copy.removeAttribute("id");
    copy.removeAttribute("class");
    copy.setAttributeNS(XMLNS_NS, "xmlns", SVG_NS);
    copy.setAttribute("version", "1.1");
    copy.setAttribute("viewBox", bounds.x + " " + bounds.y + " " + bounds.w + " " + bounds.h);
    copy.setAttribute("width", String(bounds.w));
    copy.setAttribute("height", String(bounds.h));
    const vp = copy.querySelector("#viewport");
    if (vp) { vp.removeAttribute("transform"); vp.removeAttribute("id"); }
    const title = svgEl("title");
    title.textContent = document.title;
    const bg = svgEl("rect", {x: bounds.x, y: bounds.y, width: bounds.w, height: bounds.h,
                              fill: "#ffffff"});
    copy.insertBefore(bg, copy.firstChild);
    copy.insertBefore(title, copy.firstChild);
    const text = '<?xml version="1.0" encoding="UTF-8"?>\n' +
      new XMLSerializer().serializeToString(copy) + "\n";
    const url = URL.createObjectURL(new Blob([text], {type: "image/svg+xml"}));
    const a = document.createElement("a");
    a.href = url;
    a.download = "conversation-tree.svg";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  });

  // ---- start -----------------------------------------------------------------------------
  if (nodes.length === 0) $("empty").hidden = false;
  resetView();
  // "#session=<id>" (the session tree page links so): show that sub-agent's last message
  const wanted = /^#session=([0-9a-f-]{36})$/i.exec(location.hash);
  for (const b of branchById.values()) {
    if (!wanted || str(b.sessionId) !== wanted[1].toLowerCase()) continue;
    const i = byId.get(str(b.leafId));
    if (i !== undefined) { select(i); centreOn(i); }
  }
  window.addEventListener("resize", () => fit());
  document.body.dataset.ready = "true";
})();
