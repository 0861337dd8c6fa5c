// The search box of the documentation site: search.json (one entry per section of a page, Quarto's format) is fetched
// once, every word typed must occur in an entry, and entries whose heading matches come first.
(function () {
  'use strict';
  const input = document.getElementById('search-input');
  const box = document.getElementById('search-results');
  if (!input || !box) return;
  let index = null, failed = false, selected = -1;

  async function load() {
    if (index || failed) return index;
    try {
      const r = await fetch('search.json');
      if (!r.ok) throw new Error(r.status);
      index = (await r.json()).map(e => Object.assign(e, {
        _title: (e.title || '').toLowerCase(), _section: (e.section || '').toLowerCase(), _text: (e.text || '').toLowerCase()}));
    } catch (err) { failed = true; }
    return index;
  }

  const esc = s => s.replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
  function highlight(s, terms) {
    let out = esc(s);
    for (const t of terms) out = out.replace(new RegExp('(' + t.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + ')', 'gi'), '<mark>$1</mark>');
    return out;
  }
  function snippet(text, term) {
    const i = text.toLowerCase().indexOf(term);
    if (i < 0) return text.slice(0, 140);
    const start = Math.max(0, i - 60);
    return (start > 0 ? '… ' : '') + text.slice(start, i + 100) + ' …';
  }
  function score(e, query, terms) {
    let s = 0;
    if (e._section === query) s += 1000;
    else if (e._section.includes(query)) s += 200;
    if (e._title.includes(query)) s += 50;
    for (const t of terms) {
      if (!(e._title.includes(t) || e._section.includes(t) || e._text.includes(t))) return 0;
      if (e._section.includes(t)) s += 20;
      s += Math.min(10, e._text.split(t).length - 1);
    }
    return s;
  }

  async function search() {
    const query = input.value.trim().toLowerCase();
    selected = -1;
    if (!query) { box.hidden = true; box.innerHTML = ''; return; }
    const idx = await load();
    if (!idx) {
      box.innerHTML = '<div class="search-empty">Search needs the site served over HTTP: python -m http.server -d _docs</div>';
      box.hidden = false;
      return;
    }
    const terms = query.split(/\s+/).filter(Boolean);
    const hits = idx.map(e => [score(e, query, terms), e]).filter(x => x[0] > 0).sort((a, b) => b[0] - a[0]).slice(0, 20);
    box.innerHTML = hits.length ? hits.map(([, e]) =>
      `<a class="search-result" href="${esc(e.href)}"><span class="result-title">${esc(e.title)}</span>` +
      (e.section ? ` › <span class="result-section">${highlight(e.section, terms)}</span>` : '') +
      `<span class="result-text">${highlight(snippet(e.text || '', terms[0]), terms)}</span></a>`).join('')
      : '<div class="search-empty">No results for <b>' + esc(input.value) + '</b></div>';
    box.hidden = false;
  }

  function move(step) {
    const links = box.querySelectorAll('a.search-result');
    if (!links.length) return;
    if (selected >= 0) links[selected].classList.remove('selected');
    selected = (selected + step + links.length) % links.length;
    links[selected].classList.add('selected');
    links[selected].scrollIntoView({block: 'nearest'});
  }

  input.addEventListener('input', search);
  input.addEventListener('focus', () => { if (input.value.trim()) search(); });
  input.addEventListener('keydown', ev => {
    if (ev.key === 'ArrowDown') { move(1); ev.preventDefault(); }
    else if (ev.key === 'ArrowUp') { move(-1); ev.preventDefault(); }
    else if (ev.key === 'Escape') { box.hidden = true; input.blur(); }
    else if (ev.key === 'Enter') {
      const links = box.querySelectorAll('a.search-result');
      if (links.length) window.location.href = links[Math.max(0, selected)].getAttribute('href');
    }
  });
  document.addEventListener('click', ev => { if (!ev.target.closest('.search')) box.hidden = true; });
  const q = new URLSearchParams(window.location.search).get('q');
  if (q) { input.value = q; search(); }
})();
