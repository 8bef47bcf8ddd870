// The configd console: renders what /console/events pushes, previews a
// change through /console/preview/NAME, and makes it with the admin API's
// PUT /v1/providers/NAME (If-Match: the revision previewed; Authorization:
// the admin token). Everything read from the server is put on the page as
// text, never as markup.
'use strict';

(function () {
  const $ = (sel) => document.querySelector(sel);
  const SVG = 'http://www.w3.org/2000/svg';

  const state = {
    provider: '',   // on screen
    overview: null, // the last "overview" event
    panel: null,    // the last "provider" event
    preview: null,  // the last preview, until applied or edited
    edited: false,  // the form holds the operator's input: do not refill it
    formFor: '',    // provider@revision the form was filled from
    shares: {},     // instance → the share shown, to mark changes
    es: null,
  };

  // el builds an element; attrs with a value of null or false are left out.
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  const num = (n) => (n === null || n === undefined ? '–' : String(n));
  const hms = (t) => (t ? new Date(t).toISOString().slice(11, 19) : '–');
  const hmsms = (t) => (t ? new Date(t).toISOString().slice(11, 23) : '–');
  const day = (t) => new Date(t).toISOString().slice(0, 19).replace('T', ' ');

  function age(from, to) {
    if (!from || from.startsWith('0001')) return 'never';
    const s = Math.max(0, Math.round((new Date(to) - new Date(from)) / 1000));
    return s < 60 ? s + 's ago' : Math.floor(s / 60) + 'm' + (s % 60) + 's ago';
  }

  // --- the page's address: #p=PROVIDER -------------------------------------
  // The admin token is never part of an address: it is typed into the form
  // and kept in this page's memory only.

  function readHash() {
    return new URLSearchParams(location.hash.slice(1)).get('p') || '';
  }

  function select(name) {
    if (name === state.provider) return;
    history.pushState(null, '', name ? '#p=' + encodeURIComponent(name) : location.pathname);
    show(name);
  }

  function show(name) {
    state.provider = name;
    state.panel = null;
    state.preview = null;
    state.edited = false;
    state.formFor = '';
    state.shares = {};
    $('#preview').textContent = '';
    $('#result').textContent = '';
    $('#panel').hidden = !name;
    $('#empty').hidden = !!name;
    if (name) $('#title').textContent = name;
    connect();
    renderOverview();
  }

  // --- the event stream ----------------------------------------------------

  function connect() {
    if (state.es) state.es.close();
    const url = 'events' + (state.provider ? '?provider=' + encodeURIComponent(state.provider) : '');
    const es = new EventSource(url);
    state.es = es;
    conn('connecting…', '');
    es.onopen = () => conn('live', 'live');
    es.onerror = () => conn('reconnecting…', 'down');
    es.addEventListener('overview', (ev) => {
      state.overview = JSON.parse(ev.data);
      renderOverview();
    });
    es.addEventListener('provider', (ev) => {
      const p = JSON.parse(ev.data);
      if (p.provider !== state.provider) return;
      state.panel = p;
      renderPanel();
    });
  }

  function conn(text, cls) {
    const b = $('#conn');
    b.textContent = text;
    b.className = 'badge ' + cls;
  }

  // --- the list of providers ----------------------------------------------

  function renderOverview() {
    const ov = state.overview;
    if (!ov) return;
    $('#replica').textContent = 'replica ' + ov.replica + (ov.leader ? ' (leading)' : ' (standby)');
    const body = el('tbody');
    for (const p of ov.providers) {
      // The further limits go under the first, one a line, so that the
      // pane stays narrow however many a provider has.
      const limits = el('td', { class: 'num', 'data-col': 'limit' }, `${num(p.limit)} per ${p.window}`);
      for (const m of p.more_limits ? p.more_limits.split(',') : []) limits.append(el('span', { class: 'more', text: m }));
      const tr = el('tr', { 'data-provider': p.name, class: p.name === state.provider ? 'selected' : null },
        el('td', { 'data-col': 'name', text: p.name }), limits,
        el('td', { 'data-col': 'mode' }, p.mode, el('span', { class: 'more', text: p.algorithm })),
        el('td', { class: 'num', text: p.generation ? num(p.generation) : '–' }));
      tr.addEventListener('click', () => select(p.name));
      body.append(tr);
    }
    $('#providers tbody').replaceWith(body);
    const notes = [];
    if (ov.providers.length === 0) notes.push('No provider yet: create one with configd set NAME --limit N.');
    if (ov.error) notes.push('Could not read the providers: ' + ov.error);
    for (const m of ov.malformed || []) notes.push('Malformed config: ' + m);
    $('#providers-note').textContent = notes.join(' ');
    renderForm();
  }

  // --- one provider ----------------------------------------------------------

  function renderPanel() {
    const p = state.panel;
    if (!p.found) {
      $('#config').textContent = 'No such provider: no config, no shares and no live instance under this name.';
      $('#shares').textContent = '';
      return;
    }
    const c = p.config;
    $('#config').textContent = c
      ? `limit ${c.limit} per ${c.window}${c.more_limits ? ' and ' + c.more_limits.split(',').join(' and ') : ''} · ${c.mode} · ${c.algorithm}${c.pacing ? ' · paced' : ''}${c.classes ? ' · classes ' + c.classes.split(',').join(' > ') : ''} · fail_static ${c.fail_static} · clock bound ${c.clock_bound} · revision ${p.revision}`
      : 'No valid config (deleted, or malformed): the instances keep the last good one.';
    const a = c && c.adaptive;
    $('#adaptive').hidden = !a;
    $('#adaptive').textContent = a
      ? `Adaptive${a.shadow ? ', in shadow mode (computed, not enforced)' : ''}: effective limit ${a.effective} of the ceiling ${a.ceiling} (floor ${a.floor})` +
        (a.pause_until && new Date(a.pause_until) > new Date(p.read) ? `, probing paused until ${hmsms(a.pause_until)} UTC` : '') +
        (a.reason ? ` · last move: ${a.reason}` : '')
      : '';
    const s = p.shares;
    $('#shares').textContent = p.ledger
      ? `Ledger: ${p.ledger}` + (p.leader ? ` · leader: ${p.leader}` : '')
      : s
      ? `generation ${s.generation}: total ${s.total} over ${s.instances} instances (shares add up to ${s.sum}; configd counts ${s.granted} as possibly enforced), ` +
        `in force from ${hmsms(s.effective_from)} UTC, published by ${s.published_by || '–'} at ${hms(s.published)}` +
        (p.leader ? ` · leader: ${p.leader}` : '')
      : 'No shares published yet (is a configd serve leader running?).';
    const alerts = el('ul', { id: 'alerts' });
    if (p.error) alerts.append(el('li', { text: 'Could not read the provider: ' + p.error }));
    if (p.election) alerts.append(el('li', { text: p.election }));
    if (p.publish_error) alerts.append(el('li', { text: 'Publishing fails: ' + p.publish_error }));
    if (p.ledger_over) alerts.append(el('li', { text: 'The ledger grants more than the limit: run configd audit ' + p.provider }));
    for (const m of p.malformed || []) alerts.append(el('li', { text: 'Malformed record (ignored; the last good value stays): ' + m }));
    $('#alerts').replaceWith(alerts);

    renderInstances(p);
    renderHeld(p);
    renderChart(p.chart);
    renderClasses(p);
    renderHistory(p);
    renderForm();
  }

  function renderInstances(p) {
    const body = el('tbody');
    for (const i of p.instances) {
      const share = i.share === null ? '–' : String(i.share);
      const granted = i.share !== null && i.granted > i.share ? ` (counted ${i.granted})` : '';
      const changed = i.id in state.shares && state.shares[i.id] !== share;
      state.shares[i.id] = share;
      const apw = i.admitted_per_window === null ? '–' : i.admitted_per_window.toFixed(i.admitted_per_window < 10 ? 1 : 0);
      const cls = [i.problem ? 'problem' : '', changed ? 'changed' : ''].join(' ').trim();
      // Why goes on a line of its own under the figures: a sentence read
      // across the table, which leaves the columns their width.
      body.append(el('tr', { 'data-instance': i.id, class: (cls + ' has-why').trim() },
        el('td', { 'data-col': 'id', text: i.id }),
        el('td', { 'data-col': 'host', text: i.host || '–' }),
        el('td', { class: 'num', 'data-col': 'share', text: share }, granted ? el('span', { class: 'more', text: granted.trim() }) : null),
        el('td', { class: 'num', 'data-col': 'enforced', text: num(i.enforced) }),
        el('td', { 'data-col': 'source', text: i.source }),
        el('td', { class: 'num', 'data-col': 'demand', text: num(i.demand) }),
        el('td', { class: 'num', 'data-col': 'admitted', text: apw, title: i.admitted_over ? `over the ${i.admitted_over} between its last two records; ${i.admitted} since it started` : `${i.admitted} since it started` }),
        el('td', { 'data-col': 'clock', text: i.clock }),
        el('td', { 'data-col': 'seen', text: age(i.last_seen, p.read) }),
        el('td', { class: 'num', 'data-col': 'generation', text: num(i.generation) })));
      body.append(el('tr', { 'data-why-for': i.id, class: (cls + ' why-row').trim() },
        el('td', { class: 'why', 'data-col': 'why', colspan: 10, text: i.why })));
    }
    $('#instances tbody').replaceWith(body);
    $('#instances-note').textContent = `— ${p.instances.length + (p.more_rows || 0)} live` + (p.more_rows ? ` (${p.more_rows} not listed)` : '');
  }

  function renderHeld(p) {
    const body = el('tbody');
    for (const h of p.held) {
      body.append(el('tr', { 'data-instance': h.id },
        el('td', { text: h.id }), el('td', { class: 'num', 'data-col': 'granted', text: num(h.granted) }),
        el('td', { 'data-col': 'source', text: h.source }),
        el('td', { text: h.since ? hms(h.since) : 'before this page' }), el('td', { text: h.until ? hms(h.until) : '–' }),
        el('td', { class: 'why', 'data-col': 'why', text: h.why })));
    }
    $('#held tbody').replaceWith(body);
    $('#held-box').hidden = p.held.length === 0;
  }

  function renderHistory(p) {
    const body = el('tbody');
    for (const h of p.history) {
      body.append(el('tr', { 'data-revision': h.revision },
        el('td', { text: day(h.when) }), el('td', { text: h.who }), el('td', { class: 'num', text: num(h.revision) }),
        el('td', { 'data-col': 'change', text: h.change })));
    }
    $('#history tbody').replaceWith(body);
  }

  // renderChart draws admitted per bucket as bars (pale where not every
  // instance has reported yet, hatched where the figure is an estimate),
  // the limit as a dashed step line and what configd granted as a solid
  // one. An estimate is never drawn as a count: an operator reads a solid
  // bar above the limit as a breach.
  function renderChart(c) {
    const W = 900, H = 240, L = 64, R = 12, T = 12, B = 30;
    const pts = c.points;
    const n = pts.length || 1;
    let top = 1;
    for (const p of pts) top = Math.max(top, p.limit || 0, p.granted || 0, p.admitted || 0, p.ceiling || 0, p.shadow || 0);
    top *= 1.15;
    const x = (i) => L + (i * (W - L - R)) / n;
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const bw = (W - L - R) / n;
    const s = svg('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': 'admitted per window against the limit' });
    const hatch = svg('pattern', { id: 'hatch', width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' });
    hatch.append(svg('rect', { width: 6, height: 6, fill: '#dbe7fd' }), svg('rect', { width: 2.5, height: 6, fill: '#4c8bf5' }));
    const defs = svg('defs');
    defs.append(hatch);
    s.append(defs);
    s.append(svg('line', { x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: '#999' }));
    s.append(svg('line', { x1: L, y1: T, x2: L, y2: y(0), stroke: '#999' }));
    for (const f of [0, 0.5, 1]) {
      const v = (top / 1.15) * f;
      s.append(svg('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 11, fill: '#6b7585' }, String(Math.round(v))));
    }
    let estimated = 0, overAsEstimate = 0, overCounted = 0;
    pts.forEach((p, i) => {
      let said = 'waiting for reports';
      if (p.admitted !== null) {
        said = p.estimated
          ? `about ${p.admitted.toFixed(0)} admitted, an estimate: the records allow ${p.least.toFixed(0)} to ${p.most.toFixed(0)}`
          : `${p.admitted.toFixed(0)} admitted, counted`;
      }
      const title = `${hms(p.start)} UTC: ${said}` +
        (p.limit === null ? '' : `, ${p.ceiling == null || p.shadow != null ? 'limit' : 'effective limit'} ${p.limit.toFixed(0)}`) +
        (p.ceiling == null ? '' : `, ceiling ${p.ceiling.toFixed(0)}`) + (p.shadow == null ? '' : `, shadow ${p.shadow.toFixed(0)}`) +
        (p.granted === null ? '' : `, granted ${p.granted.toFixed(0)}`);
      let r;
      if (p.admitted === null) {
        r = svg('rect', { x: x(i) + 1, y: T, width: Math.max(1, bw - 2), height: y(0) - T, fill: '#cfd8e6', opacity: 0.35, 'data-start': p.start });
      } else {
        r = svg('rect', { x: x(i) + 1, y: y(p.admitted), width: Math.max(1, bw - 2), height: Math.max(0, y(0) - y(p.admitted)),
          fill: p.estimated ? 'url(#hatch)' : '#4c8bf5', 'data-start': p.start, 'data-admitted': p.admitted.toFixed(1),
          'data-estimated': p.estimated ? 'true' : 'false' });
        const over = p.limit !== null && Math.round(p.admitted) > Math.round(p.limit);
        if (p.estimated) estimated++;
        if (over && p.estimated) overAsEstimate++;
        if (over && !p.estimated) overCounted++;
      }
      r.append(svg('title', {}, title));
      s.append(r);
    });
    // An adaptive provider's ceiling is drawn dotted above its effective
    // limit (the limit line), and in shadow mode the effective limit the
    // controller computes, not enforced, dashed in orange.
    for (const [key, color, dash] of [['ceiling', '#6a3d9a', '2 3'], ['shadow', '#c76b00', '3 3'], ['limit', '#b3261e', '6 4'], ['granted', '#1f7a46', '']]) {
      let d = '';
      pts.forEach((p, i) => {
        const v = p[key] ?? null;
        if (v === null) return;
        const prev = i > 0 ? pts[i - 1][key] ?? null : null;
        d += (prev === null ? `M${x(i)},${y(v)}` : `L${x(i)},${y(v)}`) + `L${x(i + 1)},${y(v)}`;
      });
      if (d) s.append(svg('path', { d, fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-dasharray': dash, 'data-line': key }));
    }
    if (pts.length) {
      s.append(svg('text', { x: L, y: H - 10, 'font-size': 11, fill: '#6b7585' }, hms(pts[0].start) + ' UTC'));
      s.append(svg('text', { x: W - R, y: H - 10, 'text-anchor': 'end', 'font-size': 11, fill: '#6b7585' }, hms(pts[pts.length - 1].start) + ' UTC'));
    }
    $('#chart').replaceChildren(s);
    const adaptive = pts.some((p) => p.ceiling != null), shadow = pts.some((p) => p.shadow != null);
    $('#legend-ceiling').hidden = !adaptive;
    $('#legend-shadow').hidden = !shadow;
    $('#legend-limit').textContent = adaptive && !shadow ? 'effective limit' : 'limit';
    const notes = [];
    if (overCounted) notes.push(`${overCounted} counted ${overCounted === 1 ? 'window is' : 'windows are'} over the limit.`);
    if (overAsEstimate) {
      notes.push(`${overAsEstimate} hatched ${overAsEstimate === 1 ? 'bar rises' : 'bars rise'} above the limit as an estimate, not a count: ` +
        'the records say only what each instance admitted between two of them, and spreading that evenly can put more in one window than was admitted there.');
    } else if (estimated) {
      notes.push(`${estimated} of the ${pts.length} bars are estimates (hatched).`);
    }
    $('#chart-estimates').textContent = notes.join(' ');
    $('#chart-estimates').hidden = notes.length === 0;
    $('#chart-note').textContent = c.windows > 1 ? `— per ${c.bucket} (${c.windows} windows of ${state.panel.config ? state.panel.config.window : '?'})` : `— per ${c.bucket} window`;
  }

  // renderClasses lists each priority class's admissions in the chart's
  // last buckets against its reserve. As in the chart, an estimate is
  // marked as one, never shown as a count.
  function renderClasses(p) {
    const rows = p.classes || [];
    $('#classes-box').hidden = rows.length === 0;
    if (rows.length === 0) return;
    const fig = (v) => v.toFixed(v < 10 && v !== Math.round(v) ? 1 : 0);
    const head = el('tr', {}, el('th', { text: 'class' }), el('th', { class: 'num', text: 'reserve' }));
    // Windows shorter than a second are told apart by their milliseconds.
    const when = rows[0].points.some((pt) => new Date(pt.start).getUTCMilliseconds() !== 0) ? hmsms : hms;
    for (const pt of rows[0].points) head.append(el('th', { class: 'num', text: when(pt.start) }));
    const body = el('tbody');
    for (const r of rows) {
      const tr = el('tr', { 'data-class': r.name },
        el('td', { 'data-col': 'name', text: r.name }),
        el('td', { class: 'num', 'data-col': 'reserve', text: fig(r.reserve) }));
      for (const pt of r.points) {
        const reserve = pt.reserve === null ? 'not a class then' : `of its reserve ${fig(pt.reserve)}`;
        let text = '…', title = `${when(pt.start)} UTC: waiting for reports`;
        if (pt.admitted !== null) {
          text = (pt.estimated ? '≈' : '') + fig(pt.admitted);
          title = pt.estimated
            ? `${when(pt.start)} UTC: about ${fig(pt.admitted)} admitted ${reserve}, an estimate: the records allow ${fig(pt.least)} to ${fig(pt.most)}`
            : `${when(pt.start)} UTC: ${fig(pt.admitted)} admitted ${reserve}, counted`;
        }
        tr.append(el('td', { class: 'num' + (pt.estimated ? ' estimate' : ''), 'data-start': pt.start,
          'data-admitted': pt.admitted === null ? null : pt.admitted.toFixed(1), 'data-estimated': pt.admitted === null ? null : String(!!pt.estimated),
          'data-reserve': pt.reserve === null ? null : pt.reserve.toFixed(1), title, text }));
      }
      body.append(tr);
    }
    $('#classes thead tr').replaceWith(head);
    $('#classes tbody').replaceWith(body);
    const c = p.chart;
    $('#classes-note').textContent = c.windows > 1 ? `— the last ${rows[0].points.length} buckets of ${c.bucket}` : `— the last ${rows[0].points.length} windows`;
  }

  // --- changes ---------------------------------------------------------------

  // renderForm shows the change form when configd has an admin token, and
  // fills it from the config on screen unless the operator is editing.
  function renderForm() {
    const ov = state.overview;
    const p = state.panel;
    if (!ov) return;
    $('#readonly').hidden = ov.writable;
    $('#edit').hidden = !ov.writable;
    if (!ov.writable) {
      $('#readonly').textContent = 'Read-only: configd serve runs without --admin-token-file, and the console makes changes only with the admin token. Change this provider with configd set ' +
        (state.provider || 'NAME') + ' --limit N.';
      return;
    }
    if (!p || !p.config) return;
    const key = p.provider + '@' + p.revision;
    if (state.edited || state.formFor === key) return;
    state.formFor = key;
    $('#limit').value = p.config.limit;
    $('#window').value = p.config.window;
    $('#mode').value = p.config.mode;
  }

  function edited() {
    state.edited = true;
    state.preview = null;
    $('#apply').disabled = true;
    $('#preview').textContent = '';
  }

  async function preview() {
    const name = state.provider;
    const q = new URLSearchParams({ limit: $('#limit').value.trim(), window: $('#window').value.trim(), mode: $('#mode').value });
    $('#result').textContent = '';
    let resp, body;
    try {
      resp = await fetch('preview/' + encodeURIComponent(name) + '?' + q, { cache: 'no-store' });
      body = await resp.json();
    } catch (e) {
      showPreview('preview failed: ' + e, true);
      return;
    }
    if (!resp.ok) {
      state.preview = null;
      showPreview(`${name}: ${body.error}`, true);
      return;
    }
    state.preview = body;
    showPreview(body.changed ? `${body.provider}: ${body.change} (at revision ${body.revision}; not applied yet)` : `${body.provider}: no change`, false);
    $('#apply').disabled = !body.changed;
  }

  function showPreview(text, bad) {
    const e = $('#preview');
    e.textContent = text;
    e.className = 'mono' + (bad ? ' bad' : '');
  }

  async function apply() {
    const pv = state.preview;
    if (!pv) return;
    const token = $('#token').value.trim();
    const res = $('#result');
    if (!token) {
      res.textContent = 'Type the admin token (the content of configd serve\'s --admin-token-file) to make a change.';
      res.className = 'mono bad';
      return;
    }
    $('#apply').disabled = true;
    let resp, body;
    try {
      resp = await fetch('../v1/providers/' + encodeURIComponent(pv.provider), {
        method: 'PUT',
        cache: 'no-store',
        headers: { 'Content-Type': 'application/json', 'If-Match': pv.etag, Authorization: 'Bearer ' + token, 'X-Sluice-Actor': 'console' },
        body: JSON.stringify(pv.new),
      });
      body = await resp.json();
    } catch (e) {
      res.textContent = 'not applied: ' + e;
      res.className = 'mono bad';
      return;
    }
    state.preview = null;
    state.edited = false;
    if (resp.ok) {
      res.textContent = body.changed ? `${pv.provider}: ${pv.change} (revision ${body.revision})` : `${pv.provider}: unchanged (revision ${body.revision})`;
      res.className = 'mono ok';
      $('#preview').textContent = '';
      return;
    }
    let why = body.error;
    if (resp.status === 412) why += ' — nothing was written; preview again to see the change from what is there now';
    res.textContent = `not applied (${resp.status}): ${why}`;
    res.className = 'mono bad';
  }

  // --- start -------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    for (const id of ['#limit', '#window', '#mode']) $(id).addEventListener('input', edited);
    $('#preview-btn').addEventListener('click', preview);
    $('#apply').addEventListener('click', apply);
    window.addEventListener('popstate', () => show(readHash()));
    window.addEventListener('hashchange', () => {
      const name = readHash();
      if (name !== state.provider) show(name);
    });
    show(readHash());
  });
})();
