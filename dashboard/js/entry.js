// The plotly.js the dashboard ships: the core and the four trace types its figures use.
// The full plotly.min.js (4.8 MB) costs a fresh browser 1.6-1.9 s of script compile on this
// machine class; this bundle (1.5 MB) costs 0.2 s. Rebuild with `node build.js` (see README.md).
'use strict';
var Plotly = require('plotly.js/lib/core');
Plotly.register([
    require('plotly.js/lib/bar'),       // per-step breakdown (overview, compare)
    require('plotly.js/lib/heatmap'),   // timeline occupancy, communication matrix
    require('plotly.js/lib/scattergl'), // memory and bandwidth curves with many points
]);                                     // scatter is in the core: lanes, counters, markers
module.exports = Plotly;
