/**
 * The words on the badges: short, and the same for the cell badges, the plan
 * markers and the panel.
 */

import { IPlanCell, IReplyInfo } from './protocol';

/** Seconds as people read them: "<1 ms", "12 ms", "0.4 s", "4.1 s", "73 s", "5.2 min". */
export function seconds(value: number | null): string {
  if (value === null || !Number.isFinite(value)) {
    return '?';
  }
  const s = Math.max(0, value);
  if (s < 0.001) {
    return '<1 ms';
  }
  if (s < 0.1) {
    return `${Math.round(s * 1000)} ms`;
  }
  if (s < 10) {
    return `${s.toFixed(1)} s`;
  }
  if (s < 120) {
    return `${Math.round(s)} s`;
  }
  return `${(s / 60).toFixed(1)} min`;
}

const SHORT_REASON = 40;

/**
 * The first clause of a reason, at most about 40 characters: "input df changed",
 * "code changed", "audit records every cell".
 */
export function shortReason(reason: string): string {
  let short = reason.trim();
  const cut = short.search(/[;(:]/);
  if (cut > 0) {
    short = short.slice(0, cut).trim();
  }
  if (short.length > SHORT_REASON) {
    const words = short.slice(0, SHORT_REASON).split(' ');
    if (words.length > 1) {
      words.pop();
    }
    short = words.join(' ') + '…';
  }
  return short;
}

/** The text and the tooltip of an executed cell's badge. */
export interface IBadgeText {
  text: string;
  title: string;
}

export function replyBadge(info: IReplyInfo): IBadgeText {
  const took = info.duration === null ? '' : ` in ${seconds(info.duration)}`;
  const tasks = info.task_hits + info.task_misses;
  let text: string;
  if (info.decision === 'replayed') {
    text = info.saved === null ? 'replayed' : `replayed · saved ${seconds(info.saved)}`;
  } else if (info.task_misses > 0) {
    text = `${info.decision} · ${info.task_misses}/${tasks} tasks recomputed`;
  } else if (info.task_hits > 0) {
    text = `${info.decision} · ${info.task_hits} tasks from the cache`;
  } else {
    const reason = shortReason(info.reason);
    text = reason ? `${info.decision} · ${reason}` : info.decision;
  }
  const lines = [`NBRewind: ${info.decision}${took}`, info.reason];
  if (info.decision === 'replayed') {
    if (info.cell_run !== null) {
      lines.push(`replayed cell run #${info.cell_run}`);
    }
    if (info.recorded_duration !== null) {
      lines.push(`the recorded run took ${seconds(info.recorded_duration)}`);
    }
  }
  if (tasks > 0) {
    lines.push(`Dask tasks: ${info.task_hits} from the cache, ${info.task_misses} computed`);
  }
  return { text, title: lines.filter(line => line).join('\n') };
}

/**
 * The text of a plan marker. `label(i)` names the i-th code cell of the plan
 * request ("In [3]", or "cell 4" for one that never ran).
 */
export function planBadge(cell: IPlanCell, label: (index: number) => string, kernel = ''): IBadgeText {
  if (cell.decision === 'replay') {
    const text = cell.saves === null ? 'will replay' : `will replay · saves ${seconds(cell.saves)}`;
    const run = cell.cell_run === null ? '' : `\nfrom cell run #${cell.cell_run}`;
    return { text, title: `${cell.reason}${run}` };
  }
  if (cell.decision === 'depends') {
    const on = cell.after.map(label);
    const text = on.length ? `may run · depends on ${on.join(', ')}` : 'may run';
    return { text, title: `${cell.reason}\nIt replays if what ${on.length ? on.join(', ') : 'earlier cells'} make is unchanged.` };
  }
  // The audit kernel's one reason is long and the same for every cell.
  const reason = kernel === 'audit' ? 'audit runs every cell' : shortReason(cell.reason);
  return { text: reason ? `will run · ${reason}` : 'will run', title: cell.reason };
}
