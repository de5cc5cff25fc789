/**
 * NBRewind for JupyterLab 4: a badge on every executed cell saying what the
 * kernel did, "Which cells will run?" before a Run All, and a panel listing the
 * store's cell runs with "Restore to here". Everything is inert unless the
 * notebook's kernel is an NBRewind kernel (its spec name starts with "nbrewind").
 */

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { CodeCell } from '@jupyterlab/cells';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ToolbarButton } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { rewindIcon } from './icon';
import { CellMarks, KernelWatcher } from './marks';
import { RewindPanel } from './panel';
import { isNBRewindKernel, requestPlan } from './protocol';

const PLUGIN_ID = 'nbrewind-labextension:plugin';

namespace CommandIDs {
  export const plan = 'nbrewind:plan';
  export const clearPlan = 'nbrewind:clear-plan';
  export const showPanel = 'nbrewind:show-panel';
}

const PLAN_LABEL = 'Which cells will run?';
const PLAN_CAPTION = 'NBRewind: mark the cells that Run All would run, and those it would replay from the store';

interface INotebookParts {
  watcher: KernelWatcher;
  marks: CellMarks;
}

function onNBRewind(panel: NotebookPanel | null): boolean {
  return panel !== null && isNBRewindKernel(panel.sessionContext.session?.kernel?.name);
}

/** The plan button in each notebook's toolbar, shown only on NBRewind kernels. */
class PlanButton implements DocumentRegistry.IWidgetExtension<NotebookPanel, INotebookModel> {
  constructor(private readonly _plan: (panel: NotebookPanel) => Promise<void>) {}

  createNew(panel: NotebookPanel): IDisposable {
    const button = new ToolbarButton({
      icon: rewindIcon,
      label: PLAN_LABEL,
      tooltip: PLAN_CAPTION,
      className: 'nbrewind-plan-button',
      onClick: () => void this._plan(panel)
    });
    panel.toolbar.insertItem(10, 'nbrewind-plan', button);
    const update = (): void => button.setHidden(!onNBRewind(panel));
    update();
    panel.sessionContext.kernelChanged.connect(update);
    void panel.sessionContext.ready.then(update);
    return new DisposableDelegate(() => {
      panel.sessionContext.kernelChanged.disconnect(update);
      button.dispose();
    });
  }
}

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  palette: ICommandPalette | null,
  labShell: ILabShell | null
): void {
  const parts = new WeakMap<NotebookPanel, INotebookParts>();

  const partsOf = (panel: NotebookPanel): INotebookParts => {
    let found = parts.get(panel);
    if (found === undefined) {
      const watcher = new KernelWatcher(panel);
      const marks = new CellMarks(panel, watcher);
      found = { watcher, marks };
      parts.set(panel, found);
      panel.disposed.connect(() => {
        marks.dispose();
        watcher.dispose();
        parts.delete(panel);
      });
    }
    return found;
  };

  tracker.widgetAdded.connect((_, panel) => void partsOf(panel));
  tracker.forEach(panel => void partsOf(panel));

  const plan = async (panel: NotebookPanel): Promise<void> => {
    const { watcher, marks } = partsOf(panel);
    const kernel = watcher.kernel;
    if (kernel === null) {
      Notification.warning('NBRewind: this notebook is not on an NBRewind kernel.', { autoClose: 5000 });
      return;
    }
    const cells = panel.content.widgets.filter((cell): cell is CodeCell => cell instanceof CodeCell);
    const codes = cells.map(cell => cell.model.sharedModel.getSource());
    try {
      const reply = await requestPlan(
        kernel,
        cells.map((cell, i) => ({ cell_id: cell.model.id, code: codes[i] }))
      );
      marks.showPlan(cells, codes, reply);
    } catch (error) {
      Notification.error(`NBRewind: ${error instanceof Error ? error.message : String(error)}`, { autoClose: 8000 });
    }
  };

  app.commands.addCommand(CommandIDs.plan, {
    label: PLAN_LABEL,
    caption: PLAN_CAPTION,
    icon: rewindIcon,
    isEnabled: () => onNBRewind(tracker.currentWidget),
    isVisible: () => onNBRewind(tracker.currentWidget),
    execute: async () => {
      const panel = tracker.currentWidget;
      if (panel !== null) {
        await plan(panel);
      }
    }
  });
  app.commands.addCommand(CommandIDs.clearPlan, {
    label: 'Clear the NBRewind run markers',
    isEnabled: () => tracker.currentWidget !== null,
    isVisible: () => onNBRewind(tracker.currentWidget),
    execute: () => {
      const panel = tracker.currentWidget;
      if (panel !== null) {
        partsOf(panel).marks.clearPlan();
      }
    }
  });

  const sidebar = new RewindPanel(tracker, panel => partsOf(panel).watcher);
  app.shell.add(sidebar, 'right', { rank: 700 });

  app.commands.addCommand(CommandIDs.showPanel, {
    label: 'Show the NBRewind panel (cell runs, restore)',
    icon: rewindIcon,
    execute: () => {
      if (labShell !== null) {
        labShell.activateById(sidebar.id);
      } else {
        app.shell.activateById(sidebar.id);
      }
      void sidebar.refresh();
    }
  });

  app.docRegistry.addWidgetExtension('Notebook', new PlanButton(plan));

  app.contextMenu.addItem({ command: CommandIDs.plan, selector: '.jp-Notebook .jp-Cell', rank: 20 });
  app.contextMenu.addItem({ command: CommandIDs.clearPlan, selector: '.jp-Notebook .jp-Cell', rank: 21 });

  if (palette !== null) {
    for (const command of [CommandIDs.plan, CommandIDs.clearPlan, CommandIDs.showPanel]) {
      palette.addItem({ command, category: 'NBRewind' });
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'NBRewind: cell badges, "Which cells will run?" and a time-travel panel for the NBRewind kernels.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILabShell],
  activate
};

export default plugin;
