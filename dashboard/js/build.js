// Builds ../static/plotly-<version>-msprof.min.js from entry.js, with the same esbuild settings
// plotly.js uses for its own dist bundles (its esbuild-config.js).
'use strict';
const path = require('path');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');

const version = require('plotly.js/package.json').version;
const out = path.join(__dirname, '..', 'static', `plotly-${version}-msprof.min.js`);
esbuild.build({
    entryPoints: [path.join(__dirname, 'entry.js')],
    outfile: out,
    format: 'iife',
    globalName: 'Plotly',
    bundle: true,
    minify: true,
    sourcemap: false,
    legalComments: 'eof',
    banner: { js: `/*! plotly.js v${version} (core, bar, heatmap, scattergl) | (c) Plotly, Inc. | MIT License | ` +
                  'custom bundle built by msprof-py dashboard/js/build.js */' },
    plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { regl: '@plotly/regl', stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'info',
}).catch(() => process.exit(1));
