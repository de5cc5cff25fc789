/**
 * Per notebook: what its kernel was asked to execute and what it replied
 * (KernelWatcher), and the badges and plan markers drawn on its cells (CellMarks).
 */

import { Cell, CodeCell, ICellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import type { CellChange, ISharedCell } from '@jupyter/ydoc';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IBadgeText, planBadge, replyBadge } from './format';
import { Decision, IPlanReply, IReplyInfo, PlanDecision, isNBRewindKernel, replyInfo } from './protocol';

/** An execute_request on its way to the kernel; `cellId` is the notebook cell's id, if a cell sent it. */
export interface IExecution {
  msgId: string;
  cellId: string | null;
}

/** The execute_reply to one. */
export interface IReplied extends IExecution {
  status: string;
  info: IReplyInfo | null;
}

/**
 * Follows the notebook's kernel connection (across kernel changes) and pairs each
 * execute_reply with the request, and so with the cell, that asked for it.
 * JupyterLab puts the cell's id in the request's metadata (`cellId`).
 */
export class KernelWatcher implements IDisposable {
  constructor(private readonly _panel: NotebookPanel) {
    _panel.sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    this._connect(_panel.sessionContext.session?.kernel ?? null);
  }

  get sent(): ISignal<this, IExecution> {
    return this._sent;
  }

  get replied(): ISignal<this, IReplied> {
    return this._replied;
  }

  /** The kernel now, when it is an NBRewind kernel. */
  get kernel(): Kernel.IKernelConnection | null {
    const kernel = this._panel.sessionContext.session?.kernel ?? null;
    return kernel && isNBRewindKernel(kernel.name) ? kernel : null;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._connect(null);
    Signal.clearData(this);
  }

  private _onKernelChanged(): void {
    this._connect(this._panel.sessionContext.session?.kernel ?? null);
  }

  private _connect(kernel: Kernel.IKernelConnection | null): void {
    if (this._kernel === kernel) {
      return;
    }
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._pending.clear();
    this._kernel = kernel;
    kernel?.anyMessage.connect(this._onMessage, this);
  }

  private _onMessage(kernel: Kernel.IKernelConnection, args: Kernel.IAnyMessageArgs): void {
    if (!isNBRewindKernel(kernel.name)) {
      return;
    }
    const msg = args.msg;
    if (args.direction === 'send' && msg.header.msg_type === 'execute_request') {
      const cellId = msg.metadata['cellId'];
      const execution: IExecution = { msgId: msg.header.msg_id, cellId: typeof cellId === 'string' ? cellId : null };
      this._pending.set(execution.msgId, execution.cellId);
      this._sent.emit(execution);
      return;
    }
    if (args.direction === 'recv' && KernelMessage.isExecuteReplyMsg(msg)) {
      const parent = msg.parent_header;
      const msgId = 'msg_id' in parent ? parent.msg_id : undefined;
      if (msgId === undefined || !this._pending.has(msgId)) {
        return;
      }
      const cellId = this._pending.get(msgId) ?? null;
      this._pending.delete(msgId);
      this._replied.emit({ msgId, cellId, status: msg.content.status, info: replyInfo(msg.metadata) });
    }
  }

  private _disposed = false;
  private _kernel: Kernel.IKernelConnection | null = null;
  private readonly _pending = new Map<string, string | null>();
  private readonly _sent = new Signal<this, IExecution>(this);
  private readonly _replied = new Signal<this, IReplied>(this);
}

interface IBadge extends IBadgeText {
  decision: Decision;
  status: string;
}

interface IPlanMark extends IBadgeText {
  decision: PlanDecision;
}

interface ICellState {
  badge?: IBadge;
  plan?: IPlanMark;
}

const ROW_CLASS = 'nbrewind-row';
const PLAN_ATTRIBUTE = 'data-nbrewind-plan';

/** The CSS modifier of a decision: "replayed", "ran", "not-recorded". */
function slug(text: string): string {
  return text.replace(/\s+/g, '-');
}

/**
 * The badges and plan markers of one notebook. The state is kept by cell id and
 * drawn into the cell's DOM (a row below its input), so a cell that is not
 * rendered yet (JupyterLab renders cells lazily) gets it when it renders.
 */
export class CellMarks implements IDisposable {
  constructor(
    private readonly _panel: NotebookPanel,
    watcher: KernelWatcher
  ) {
    watcher.sent.connect(this._onSent, this);
    watcher.replied.connect(this._onReplied, this);
    _panel.sessionContext.kernelChanged.connect(this._onKernelChanged, this);
    _panel.sessionContext.statusChanged.connect(this._onStatusChanged, this);
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    for (const model of this._watched) {
      model.sharedModel.changed.disconnect(this._onCellChanged, this);
    }
    this._watched.clear();
    this._panel.sessionContext.kernelChanged.disconnect(this._onKernelChanged, this);
    this._panel.sessionContext.statusChanged.disconnect(this._onStatusChanged, this);
    Signal.clearData(this);
  }

  /**
   * Mark the cells of a plan. `cells` are the code cells the plan request listed, in
   * order, and `codes` the sources it sent: a cell edited while the kernel was
   * planning is left unmarked (the plan was for its old code).
   */
  showPlan(cells: Cell[], codes: string[], reply: IPlanReply): void {
    this.clearPlan();
    const label = (index: number): string => {
      const cell = cells[index];
      if (cell === undefined) {
        return `cell ${index + 1}`;
      }
      const count = cell instanceof CodeCell ? cell.model.executionCount : null;
      return count ? `In [${count}]` : `cell ${this._panel.content.widgets.indexOf(cell) + 1}`;
    };
    for (const planned of reply.cells) {
      const cell = cells[planned.index];
      if (cell === undefined || cell.isDisposed || cell.model.sharedModel.getSource() !== codes[planned.index]) {
        continue;
      }
      const state = this._state(cell.model.id);
      state.plan = { ...planBadge(planned, label, reply.kernel), decision: planned.decision };
      this._watch(cell.model);
      this._render(cell);
    }
  }

  /** Remove every plan marker. */
  clearPlan(): void {
    for (const [id, state] of this._states) {
      if (state.plan !== undefined) {
        delete state.plan;
        this._renderId(id);
      }
    }
  }

  /** Remove every badge and marker. */
  clearAll(): void {
    const ids = [...this._states.keys()];
    this._states.clear();
    for (const id of ids) {
      this._renderId(id);
    }
  }

  /** A plan is for the kernel that made it; badges stay while the kernel is an NBRewind one. */
  private _onKernelChanged(): void {
    const kernel = this._panel.sessionContext.session?.kernel ?? null;
    if (kernel !== null && !isNBRewindKernel(kernel.name)) {
      this.clearAll();
    } else {
      this.clearPlan();
    }
  }

  /** A restarted kernel starts from nothing: a plan made before says nothing about it. */
  private _onStatusChanged(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this.clearPlan();
    }
  }

  private _state(id: string): ICellState {
    let state = this._states.get(id);
    if (state === undefined) {
      state = {};
      this._states.set(id, state);
    }
    return state;
  }

  private _watch(model: ICellModel): void {
    if (!this._watched.has(model)) {
      this._watched.add(model);
      model.sharedModel.changed.connect(this._onCellChanged, this);
    }
  }

  private _onCellChanged(shared: ISharedCell, change: CellChange): void {
    if (change.sourceChange === undefined) {
      return;
    }
    const state = this._states.get(shared.getId());
    if (state?.plan !== undefined) {
      delete state.plan;
      this._renderId(shared.getId());
    }
  }

  private _onSent(_: KernelWatcher, execution: IExecution): void {
    if (execution.cellId === null) {
      return;
    }
    const state = this._states.get(execution.cellId);
    if (state !== undefined && (state.plan !== undefined || state.badge !== undefined)) {
      delete state.plan;
      delete state.badge;
      this._renderId(execution.cellId);
    }
  }

  private _onReplied(_: KernelWatcher, replied: IReplied): void {
    if (replied.cellId === null || replied.info === null) {
      return;
    }
    const state = this._state(replied.cellId);
    state.badge = { ...replyBadge(replied.info), decision: replied.info.decision, status: replied.status };
    this._renderId(replied.cellId);
  }

  private _renderId(id: string): void {
    const cell = this._panel.content.widgets.find(c => c.model.id === id);
    if (cell !== undefined) {
      this._render(cell);
    }
  }

  private _render(cell: Cell): void {
    if (cell.isDisposed) {
      return;
    }
    if (cell.isPlaceholder()) {
      void cell.ready.then(() => this._render(cell));
      return;
    }
    const state = this._states.get(cell.model.id) ?? {};
    const node = cell.node;
    let row = node.querySelector<HTMLDivElement>(`:scope > .${ROW_CLASS}`);
    if (state.plan === undefined && state.badge === undefined) {
      row?.remove();
      node.removeAttribute(PLAN_ATTRIBUTE);
      return;
    }
    if (row === null) {
      row = document.createElement('div');
      row.className = ROW_CLASS;
      const input = cell.inputArea?.node.parentElement;
      if (input && input.parentElement === node) {
        input.insertAdjacentElement('afterend', row);
      } else {
        node.appendChild(row);
      }
    }
    row.replaceChildren();
    if (state.plan !== undefined) {
      node.setAttribute(PLAN_ATTRIBUTE, state.plan.decision);
      row.appendChild(badge(state.plan, ['nbrewind-plan', `nbrewind-plan-${state.plan.decision}`]));
    } else {
      node.removeAttribute(PLAN_ATTRIBUTE);
    }
    if (state.badge !== undefined) {
      const classes = ['nbrewind-decision', `nbrewind-decision-${slug(state.badge.decision)}`];
      if (state.badge.status === 'error') {
        classes.push('nbrewind-mod-error');
      }
      const element = badge(state.badge, classes);
      element.dataset.nbrewindDecision = state.badge.decision;
      row.appendChild(element);
    }
  }

  private _disposed = false;
  private readonly _states = new Map<string, ICellState>();
  private readonly _watched = new Set<ICellModel>();
}

function badge(text: IBadgeText, classes: string[]): HTMLSpanElement {
  const element = document.createElement('span');
  element.classList.add('nbrewind-badge', ...classes);
  element.textContent = text.text;
  element.title = text.title;
  return element;
}
