import { LabIcon } from '@jupyterlab/ui-components';

/** Two triangles pointing back: rewind. `jp-icon3` lets the theme colour it. */
const REWIND_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
  '<g class="jp-icon3" fill="#616161">' +
  '<path d="M11.5 5.5v13L2.5 12z"/><path d="M21.5 5.5v13l-9-6.5z"/>' +
  '</g></svg>';

export const rewindIcon = new LabIcon({ name: 'nbrewind:rewind', svgstr: REWIND_SVG });
