// Appended by tests/tests/html.rs to a copy of a gpustall HTML page: measures where the
// browser laid things out once the page has loaded and its own scripts (a flame graph's) have
// run, and writes it as JSON into a new pre#measure, for --dump-dom.
window.addEventListener('load', () => setTimeout(() => {
  const box = e => {
    const b = e.getBoundingClientRect();
    return { left: b.left, right: b.right, top: b.top, bottom: b.bottom };
  };
  const de = document.documentElement;
  const legendOf = div => [...div.children].map(e => ({
    text: e.textContent, ...box(e), color: getComputedStyle(e.firstElementChild).backgroundColor,
  }));
  const out = {
    scroll_width: de.scrollWidth,
    client_width: de.clientWidth,
    legends: [...document.querySelectorAll('.legend')].map(legendOf),
    marks: [...document.querySelectorAll('svg.chart text.mark')].map(m => ({
      text: m.textContent, ...box(m), plot: box(m.closest('svg').querySelector('rect.plot')),
    })),
    charts: [...document.querySelectorAll('svg.chart')].map(s => ({
      title: s.getAttribute('aria-label'), ...box(s),
      font: getComputedStyle(s.querySelector('text')).fontFamily,
    })),
    flame_graphs: [...document.querySelectorAll('iframe.flame')].map(f => ({
      title: f.title, ...box(f), font: getComputedStyle(f).fontFamily,
    })),
    waits: null,
  };
  const svg = [...document.querySelectorAll('svg.chart')].find(s => s.querySelector('g.lane'));
  if (svg) {
    // The time scale, from the tick labels ("0s", "10s", ..: centred on their tick).
    const ticks = [...svg.querySelectorAll('text')]
      .filter(t => /^\d+s$/.test(t.textContent))
      .map(t => ({ s: parseFloat(t.textContent), x: (box(t).left + box(t).right) / 2 }));
    out.waits = {
      ticks,
      plot: box(svg.querySelector('rect.plot')),
      legend: legendOf(svg.previousElementSibling),
      lanes: [...svg.querySelectorAll('g.lane')].map(g => ({
        pid: +g.dataset.pid,
        tid: +g.dataset.tid,
        spans: [...g.querySelectorAll('rect.wait')].map(r => ({
          waker: +r.dataset.waker, ...box(r), fill: getComputedStyle(r).fill,
        })),
      })),
    };
  }
  const pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 100));
