// SF Symbols as small SVG drawings (24×24, stroked), for the names the docs and CLI examples
// use and the ones jobs commonly pick. A name is matched whole, then by its leading parts
// (`arrow.down.circle.fill` → `arrow.down.circle` → `arrow.down`); `.fill` fills the shape.
// Anything unknown gets a neutral gear-like mark, never a letter.
'use strict';

const SYMBOL_PATHS = {
  'arrow.down': 'M12 4v13M6 11l6 6 6-6',
  'arrow.up': 'M12 20V7M6 13l6-6 6 6',
  'arrow.down.circle': 'C M12 7v9M8 12l4 4 4-4',
  'arrow.up.circle': 'C M12 17V8M8 12l4-4 4 4',
  'arrow.down.to.line': 'M12 3v12M7 10l5 5 5-5M5 20h14',
  'arrow.up.to.line': 'M12 21V9M7 14l5-5 5 5M5 4h14',
  'arrow.triangle.2.circlepath': 'M5 12a7 7 0 0 1 12-5l2 2M19 5v4h-4M19 12a7 7 0 0 1-12 5l-2-2M5 19v-4h4',
  'arrow.clockwise': 'M19 12a7 7 0 1 1-2-5M19 4v4h-4',
  'icloud': 'M7 18h10a4 4 0 0 0 .5-8A6 6 0 0 0 6 10.5 3.8 3.8 0 0 0 7 18z',
  'icloud.and.arrow.down': 'M7 17a3.8 3.8 0 0 1-1-7.5A6 6 0 0 1 17.5 9 4 4 0 0 1 17 17M12 11v9M9 17l3 3 3-3',
  'icloud.and.arrow.up': 'M7 17a3.8 3.8 0 0 1-1-7.5A6 6 0 0 1 17.5 9 4 4 0 0 1 17 17M12 20v-9M9 14l3-3 3 3',
  'film': 'R3 5 18 14 M7 5v14M17 5v14M3 9.5h4M3 14.5h4M17 9.5h4M17 14.5h4',
  'play': 'M8 5l11 7-11 7z',
  'play.circle': 'C M10 8l6 4-6 4z',
  'gear': 'M12 8.5a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7zM12 2v3M12 19v3M2 12h3M19 12h3M4.9 4.9l2.1 2.1M17 17l2.1 2.1M4.9 19.1L7 17M17 7l2.1-2.1',
  'gearshape': 'M12 8.5a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7zM12 2v3M12 19v3M2 12h3M19 12h3M4.9 4.9l2.1 2.1M17 17l2.1 2.1M4.9 19.1L7 17M17 7l2.1-2.1',
  'cpu': 'R6 6 12 12 M9.5 9.5h5v5h-5zM9 2v4M15 2v4M9 18v4M15 18v4M2 9h4M2 15h4M18 9h4M18 15h4',
  'memorychip': 'R3 7 18 10 M7 10v4M11 10v4M15 10v4M6 17v3M10 17v3M14 17v3M18 17v3',
  'brain': 'M12 5a3 3 0 0 0-5.5 1.5A3 3 0 0 0 4 11a3 3 0 0 0 1 5 3 3 0 0 0 5 2.5L12 19V5zM12 5a3 3 0 0 1 5.5 1.5A3 3 0 0 1 20 11a3 3 0 0 1-1 5 3 3 0 0 1-5 2.5L12 19',
  'hammer': 'M14 4l6 6-3 3-6-6zM11 7L4 18l2 2 11-7',
  'wrench': 'M15 4a5 5 0 0 0-5 6.5L4 16.5 7.5 20l6-6A5 5 0 0 0 20 9l-3 3-3-1-1-3z',
  'wrench.and.screwdriver': 'M15 4a5 5 0 0 0-5 6.5L4 16.5 7.5 20l6-6A5 5 0 0 0 20 9l-3 3-3-1-1-3zM4 4l6 6',
  'externaldrive': 'R3 8 18 9 M3 13h18M17 15.5h.01',
  'internaldrive': 'R3 8 18 9 M3 13h18M17 15.5h.01',
  'archivebox': 'R3 4 18 5 M4 9v11h16V9M10 13h4',
  'doc': 'M6 3h8l4 4v14H6zM14 3v4h4',
  'doc.text': 'M6 3h8l4 4v14H6zM14 3v4h4M9 12h6M9 16h6',
  'folder': 'M3 6h6l2 2h10v11H3z',
  'shippingbox': 'M12 3l8 4v10l-8 4-8-4V7zM4 7l8 4 8-4M12 11v10',
  'shippingbox.and.arrow.backward': 'M12 3l8 4v10l-8 4-8-4V7zM4 7l8 4 8-4M12 11v10',
  'clock': 'C M12 7v5l3 3',
  'timer': 'M12 22a8 8 0 1 0 0-16 8 8 0 0 0 0 16zM12 10v4M10 2h4',
  'hourglass': 'M7 3h10M7 21h10M8 3c0 5 8 5 8 9s-8 4-8 9M16 3c0 5-8 5-8 9s8 4 8 9',
  'bolt': 'M13 2L4 14h7l-1 8 9-12h-7z',
  'server.rack': 'R3 4 18 5 M3 15h18v5H3zM7 6.5h.01M7 17.5h.01',
  'desktopcomputer': 'R2 4 20 12 M8 20h8M12 16v4',
  'laptopcomputer': 'R4 5 16 10 M2 19h20',
  'terminal': 'R2 4 20 16 M6 9l3 3-3 3M11 15h6',
  'checkmark': 'M4 12l5 5L20 6',
  'checkmark.circle': 'C M8 12l3 3 5-6',
  'checkmark.seal': 'C M8 12l3 3 5-6',
  'xmark': 'M6 6l12 12M18 6L6 18',
  'xmark.circle': 'C M9 9l6 6M15 9l-6 6',
  'exclamationmark.triangle': 'M12 3l10 18H2zM12 10v5M12 18h.01',
  'trash': 'M4 7h16M9 7V4h6v3M6 7l1 14h10l1-14',
  'envelope': 'R3 5 18 14 M3 6l9 7 9-7',
  'paperplane': 'M3 11l18-8-8 18-2-8z',
  'photo': 'R3 5 18 14 M3 16l5-5 4 4 3-3 6 6M15.5 9.5h.01',
  'camera': 'M3 8h4l2-3h6l2 3h4v11H3zM12 10a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7z',
  'video': 'R2 6 14 12 M16 10l6-3v10l-6-3',
  'music.note': 'M9 18a3 3 0 1 1-3-3 3 3 0 0 1 3 3zM9 18V5l10-2v12M19 15a3 3 0 1 1-3-3 3 3 0 0 1 3 3z',
  'waveform': 'M3 12h2M7 8v8M11 4v16M15 7v10M19 10v4',
  'globe': 'C M3 12h18M12 3c3 3 3 15 0 18M12 3c-3 3-3 15 0 18',
  'network': 'M12 3v6M5 21v-4h14v4M12 13v4M9 9h6v4H9z',
  'wifi': 'M2 9a15 15 0 0 1 20 0M5 12.5a10 10 0 0 1 14 0M8.5 16a5 5 0 0 1 7 0M12 19.5h.01',
  'antenna.radiowaves.left.and.right': 'M12 10v11M8 7a5 5 0 0 0 0 6M16 7a5 5 0 0 1 0 6M5 4a9 9 0 0 0 0 12M19 4a9 9 0 0 1 0 12',
  'lock': 'R5 11 14 10 M8 11V7a4 4 0 0 1 8 0v4',
  'key': 'M8 15a4 4 0 1 1 0-.01zM11 12l9-9M16 7l3 3',
  'shield': 'M12 3l8 3v6c0 5-4 8-8 9-4-1-8-4-8-9V6z',
  'sparkles': 'M12 3l2 6 6 2-6 2-2 6-2-6-6-2 6-2zM19 3v4M17 5h4',
  'flame': 'M12 22c4 0 7-3 7-7 0-5-5-7-5-12-3 2-4 5-4 8-1-1-2-2-2-4-2 2-3 5-3 8 0 4 3 7 7 7z',
  'cube': 'M12 3l8 4v10l-8 4-8-4V7zM4 7l8 4 8-4M12 11v10',
  'chart.bar': 'M4 20V10M10 20V4M16 20v-7M2 20h20',
  'chart.line.uptrend.xyaxis': 'M3 3v18h18M6 15l4-4 3 3 6-7',
  'square.stack.3d.up': 'M12 3l9 4-9 4-9-4zM3 12l9 4 9-4M3 16.5l9 4 9-4',
  'calendar': 'R3 5 18 16 M3 10h18M8 3v4M16 3v4',
  'person': 'M12 12a4 4 0 1 0 0-8 4 4 0 0 0 0 8zM4 21a8 8 0 0 1 16 0',
  'bell': 'M6 17V11a6 6 0 0 1 12 0v6l2 2H4zM10 21h4',
  'iphone': 'R7 2 10 20 M11 18h2',
  'printer': 'M7 9V3h10v6M7 17H4V9h16v8h-3M7 14h10v7H7z',
  'tray.and.arrow.down': 'M3 14h5l1 3h6l1-3h5v6H3zM12 3v9M8 8l4 4 4-4',
  'leaf': 'M5 19C5 9 11 4 20 4c0 9-5 15-15 15zM5 19l8-8',
  'hare': 'M4 17c0-4 4-7 9-7l3-6 1 6c2 1 3 3 3 5s-2 3-4 3H6z',
  'tortoise': 'M3 16c0-5 4-8 8-8s8 3 8 8zM19 13h2M6 16v3M16 16v3',
};
// A neutral mark for names the set does not cover: a rounded square with a dot.
const SYMBOL_FALLBACK = 'R4 4 16 16 M12 12h.01';

function symbolPath(name) {
  if (!name) return SYMBOL_FALLBACK;
  const parts = name.replace(/\.fill$/, '').split('.');
  for (let i = parts.length; i > 0; i--) {
    const candidate = parts.slice(0, i).join('.');
    if (SYMBOL_PATHS[candidate]) return SYMBOL_PATHS[candidate];
  }
  return SYMBOL_FALLBACK;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/// An <svg> for an SF Symbol name: `C` draws a circle around, `R x y w h` a rounded rect.
function symbolSVG(name, size) {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('width', String(size || 24));
  svg.setAttribute('height', String(size || 24));
  svg.setAttribute('aria-hidden', 'true');
  svg.classList.add('sym');
  drawSymbol(svg, name);
  return svg;
}

function drawSymbol(svg, name) {
  if (svg.dataset.symbol === (name || '')) return;
  svg.dataset.symbol = name || '';
  svg.textContent = '';
  const filled = !!name && /\.fill$/.test(name);
  let d = symbolPath(name);
  const add = (tag, attrs) => {
    const el = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) el.setAttribute(k, attrs[k]);
    svg.appendChild(el);
    return el;
  };
  if (d.startsWith('C ')) {
    add('circle', { cx: 12, cy: 12, r: 9.5, class: filled ? 'sym-fill' : '' });
    d = d.slice(2);
  } else if (d.startsWith('R')) {
    const m = /^R(\S+) (\S+) (\S+) (\S+) ?/.exec(d);
    add('rect', { x: m[1], y: m[2], width: m[3], height: m[4], rx: 2.5, class: filled ? 'sym-fill' : '' });
    d = d.slice(m[0].length);
  }
  if (d) add('path', { d, class: filled && !svg.querySelector('.sym-fill') ? 'sym-fill' : 'sym-line' });
  svg.classList.toggle('filled', filled);
}

window.symbolSVG = symbolSVG;
window.drawSymbol = drawSymbol;
window.SYMBOL_NAMES = Object.keys(SYMBOL_PATHS);
