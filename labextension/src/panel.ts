/**
 * The NBRewind side panel: the store's sessions and cell runs for the current
 * notebook, and "Restore to here" on each run.
 */

import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage } from '@jupyterlab/services';
import { refreshIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { seconds, shortReason } from './format';
import { rewindIcon } from './icon';
import { IReplied, KernelWatcher } from './marks';
import { ILogCell, ILogReply, ILogSession, isNBRewindKernel, requestLog } from './protocol';

/** Wait this long after a reply before asking for the log (a Run All sends many). */
const REFRESH_DELAY_MS = 400;
/** And once more after this: a cell that ran is recorded in the background after its reply. */
const LATE_REFRESH_MS = 2500;

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function started(epoch: number | null): string {
  if (epoch === null) {
    return 'start unknown';
  }
  return new Date(epoch * 1000).toLocaleString(undefined, {
    month: 'short',
    day: 'numeric',
    hour: '2-digit',
    minute: '2-digit',
    second: '2-digit',
    hour12: false
  });
}

export class RewindPanel extends Widget {
  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _watcherOf: (panel: NotebookPanel) => KernelWatcher | undefined
  ) {
    super();
    this.id = 'nbrewind-panel';
    this.addClass('nbrewind-panel');
    this.title.icon = rewindIcon;
    this.title.caption = 'NBRewind';

    const header = element('div', 'nbrewind-panel-header');
    header.appendChild(element('h2', 'nbrewind-panel-title', 'NBRewind'));
    const refresh = element('button', 'jp-Button jp-mod-minimal jp-mod-styled nbrewind-panel-refresh');
    refresh.title = 'Ask the kernel for its cell runs again';
    refresh.appendChild(refreshIcon.element({ tag: 'span', className: 'nbrewind-panel-refresh-icon' }));
    refresh.appendChild(element('span', 'nbrewind-panel-refresh-label', 'Refresh'));
    refresh.addEventListener('click', () => void this.refresh());
    header.appendChild(refresh);
    this.node.appendChild(header);

    this._subtitle = element('div', 'nbrewind-panel-subtitle');
    this.node.appendChild(this._subtitle);
    this._message = element('div', 'nbrewind-panel-message');
    this.node.appendChild(this._message);
    this._output = element('pre', 'nbrewind-panel-output');
    this._output.hidden = true;
    this.node.appendChild(this._output);
    this._list = element('div', 'nbrewind-panel-sessions');
    this.node.appendChild(this._list);

    _tracker.currentChanged.connect(this._onCurrentChanged, this);
    this._onCurrentChanged();
  }

  /** Ask the kernel for the log and show it. */
  async refresh(): Promise<void> {
    this._stale = false;
    const notebook = this._notebook;
    const kernel = this._kernel();
    const generation = ++this._generation;
    if (notebook === null) {
      this._show('Open a notebook to see its cell runs.');
      return;
    }
    this._subtitle.textContent = notebook.context.path;
    if (kernel === null) {
      this._show('This notebook is not on an NBRewind kernel: choose NBRewind (audit) or (repeat) to record its cells.');
      return;
    }
    this.node.classList.add('nbrewind-mod-loading');
    try {
      const log = await requestLog(kernel);
      if (generation === this._generation) {
        this._render(log);
      }
    } catch (error) {
      if (generation === this._generation) {
        this._show(`The kernel did not give its log: ${error instanceof Error ? error.message : String(error)}`);
      }
    } finally {
      if (generation === this._generation) {
        this.node.classList.remove('nbrewind-mod-loading');
      }
    }
  }

  /** Refresh soon (and again a little later), if the panel is showing; else when it shows. */
  scheduleRefresh(): void {
    window.clearTimeout(this._soon);
    window.clearTimeout(this._late);
    const fire = (): void => {
      if (!this.isVisible) {
        this._stale = true;
        return;
      }
      const kernel = this._kernel();
      if (kernel !== null && kernel.status === 'busy') {
        this._soon = window.setTimeout(fire, REFRESH_DELAY_MS); // more is coming: wait for idle
        return;
      }
      void this.refresh();
    };
    this._soon = window.setTimeout(fire, REFRESH_DELAY_MS);
    this._late = window.setTimeout(fire, LATE_REFRESH_MS);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this._soon);
    window.clearTimeout(this._late);
    this._follow(null);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (this._stale) {
      void this.refresh();
    }
  }

  private _kernel(): Kernel.IKernelConnection | null {
    const kernel = this._notebook?.sessionContext.session?.kernel ?? null;
    return kernel && isNBRewindKernel(kernel.name) ? kernel : null;
  }

  private _onCurrentChanged(): void {
    this._follow(this._tracker.currentWidget);
    this._stale = true;
    this.scheduleRefresh();
  }

  private _follow(notebook: NotebookPanel | null): void {
    if (this._notebook === notebook) {
      return;
    }
    if (this._notebook !== null) {
      this._notebook.sessionContext.kernelChanged.disconnect(this._onKernelChanged, this);
      this._notebook.sessionContext.statusChanged.disconnect(this._onStatusChanged, this);
      this._watched?.replied.disconnect(this._onReplied, this);
    }
    this._notebook = notebook;
    this._watched = notebook ? this._watcherOf(notebook) ?? null : null;
    if (notebook !== null) {
      notebook.sessionContext.kernelChanged.connect(this._onKernelChanged, this);
      notebook.sessionContext.statusChanged.connect(this._onStatusChanged, this);
      this._watched?.replied.connect(this._onReplied, this);
    }
    this._output.hidden = true;
    this._output.textContent = '';
    this._restored = null;
  }

  private _onKernelChanged(): void {
    this._stale = true;
    this.scheduleRefresh();
  }

  /** A restarted kernel is a new session: show it once the kernel is up. */
  private _onStatusChanged(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'starting') {
      this._restarting = true;
    } else if (status === 'idle' && this._restarting) {
      this._restarting = false;
      this.scheduleRefresh();
    }
  }

  private _onReplied(_: KernelWatcher, replied: IReplied): void {
    if (replied.cellId !== null && this._restored !== null) {
      this._restored = null; // a cell ran since: the namespace is no longer the restored one
    }
    this.scheduleRefresh();
  }

  private _show(message: string): void {
    this._message.textContent = message;
    this._message.hidden = false;
    this._list.replaceChildren();
  }

  private _render(log: ILogReply): void {
    this._message.hidden = true;
    const sessions = log.sessions.map(session => this._renderSession(session));
    if (sessions.length === 0) {
      this._show('Nothing recorded yet: run a cell.');
      return;
    }
    this._list.replaceChildren(...sessions);
  }

  private _renderSession(session: ILogSession): HTMLElement {
    const node = element('section', 'nbrewind-session');
    node.dataset.session = session.session;
    if (session.current) {
      node.classList.add('nbrewind-mod-current');
    }
    const head = element('div', 'nbrewind-session-head');
    head.appendChild(element('span', `nbrewind-session-kernel nbrewind-kernel-${session.kernel}`, session.kernel));
    head.appendChild(element('span', 'nbrewind-session-started', started(session.started)));
    if (session.current) {
      head.appendChild(element('span', 'nbrewind-session-current', 'this kernel'));
    }
    head.title = `session ${session.session}`;
    node.appendChild(head);
    if (session.cells.length === 0) {
      node.appendChild(element('div', 'nbrewind-run-empty', 'no cell runs'));
    }
    for (const run of session.cells) {
      node.appendChild(this._renderRun(run));
    }
    return node;
  }

  private _renderRun(run: ILogCell): HTMLElement {
    const node = element('div', 'nbrewind-run');
    node.dataset.cellRun = String(run.cell_run);
    if (run.cell_id !== null) {
      node.dataset.cellId = run.cell_id;
    }
    if (run.cell_run === this._restored) {
      node.classList.add('nbrewind-mod-restored');
    }
    node.title = `cell run #${run.cell_run}: ${run.decision}${run.status && run.status !== 'ok' ? ` (${run.status})` : ''}\n${run.reason}`;
    const line = element('div', 'nbrewind-run-line');
    line.appendChild(element('span', 'nbrewind-run-count', run.execution_count === null ? '[ ]' : `[${run.execution_count}]`));
    const decision = element('span', `nbrewind-badge nbrewind-decision nbrewind-decision-${run.decision.replace(/\s+/g, '-')}`, run.decision);
    if (run.status && run.status !== 'ok') {
      decision.classList.add('nbrewind-mod-error');
      decision.textContent = `${run.decision} · ${run.status}`;
    }
    line.appendChild(decision);
    line.appendChild(element('span', 'nbrewind-run-duration', seconds(run.duration)));
    if (run.reason) {
      line.appendChild(element('span', 'nbrewind-run-reason', shortReason(run.reason)));
    }
    node.appendChild(line);
    const second = element('div', 'nbrewind-run-line');
    second.appendChild(element('span', 'nbrewind-run-code', run.code || ' '));
    const restore = element('button', 'jp-Button nbrewind-run-restore', 'Restore to here');
    restore.title = `Make the kernel's variables what they were after cell run #${run.cell_run}`;
    restore.addEventListener('click', () => void this._restore(run));
    second.appendChild(restore);
    node.appendChild(second);
    return node;
  }

  /** `%nbrewind restore #N` in the notebook's kernel; what it prints goes to the panel. */
  private async _restore(run: ILogCell): Promise<void> {
    const kernel = this._kernel();
    if (kernel === null) {
      this._show('This notebook is not on an NBRewind kernel.');
      return;
    }
    const code = `%nbrewind restore #${run.cell_run}`;
    const output = this._output;
    output.hidden = false;
    output.classList.remove('nbrewind-mod-error');
    output.textContent = '';
    output.dataset.cellRun = String(run.cell_run);
    output.appendChild(element('span', 'nbrewind-panel-output-code', code + '\n'));
    const text = element('span', 'nbrewind-panel-output-text');
    output.appendChild(text);
    const future = kernel.requestExecute({ code, silent: false, store_history: false, allow_stdin: false, stop_on_error: false });
    future.onIOPub = (msg: KernelMessage.IIOPubMessage): void => {
      if (KernelMessage.isStreamMsg(msg)) {
        text.textContent += msg.content.text;
      } else if (KernelMessage.isErrorMsg(msg)) {
        output.classList.add('nbrewind-mod-error');
        text.textContent += `${msg.content.ename}: ${msg.content.evalue}\n`;
      } else if (KernelMessage.isExecuteResultMsg(msg) || KernelMessage.isDisplayDataMsg(msg)) {
        const plain = msg.content.data['text/plain'];
        if (typeof plain === 'string') {
          text.textContent += plain + '\n';
        }
      }
    };
    try {
      await future.done;
    } catch (error) {
      output.classList.add('nbrewind-mod-error');
      text.textContent += error instanceof Error ? error.message : String(error);
    }
    if (!output.classList.contains('nbrewind-mod-error') && text.textContent?.startsWith('restored')) {
      this._restored = run.cell_run;
    }
    output.dataset.done = 'true';
    void this.refresh();
  }

  private _notebook: NotebookPanel | null = null;
  private _watched: KernelWatcher | null = null;
  private _generation = 0;
  private _stale = true;
  private _restarting = false;
  /** The cell run the kernel's namespace was last restored to, until a cell runs. */
  private _restored: number | null = null;
  private _soon = 0;
  private _late = 0;
  private readonly _subtitle: HTMLDivElement;
  private readonly _message: HTMLDivElement;
  private readonly _output: HTMLPreElement;
  private readonly _list: HTMLDivElement;
}
