// What bare V8 (mini-racer, in lantern serve) lacks and web-xgrammar's emscripten loader reads: a
// location for its script URL, atob for its inlined wasm, a console for its error lines (grammars.ts
// listens to console.error), and performance.now for grammars.ts's compile timer.
// Prepended to dist/schema-host.js by build.mjs; a browser never loads that file.
var location = globalThis.location || { href: "file:///schema-host.js" };
var console = globalThis.console || { log() {}, warn() {}, error() {} };
var performance = globalThis.performance || { now: () => Date.now() };
var atob =
  globalThis.atob ||
  function (text) {
    var digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    var out = [];
    var bits = 0;
    var count = 0;
    for (var i = 0; i < text.length && text[i] !== "="; i++) {
      var v = digits.indexOf(text[i]);
      if (v < 0) continue;
      bits = ((bits << 6) | v) & 0xffffff;
      count += 6;
      if (count >= 8) {
        count -= 8;
        out.push(String.fromCharCode((bits >> count) & 255));
      }
    }
    return out.join("");
  };
