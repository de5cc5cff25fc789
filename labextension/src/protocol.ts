/**
 * What the NBRewind kernels tell a frontend: the `metadata.nbrewind` of an
 * execute_reply (docs/reply-metadata.md) and the `nbrewind` comm (plan, log).
 */

import { Kernel, KernelMessage } from '@jupyterlab/services';
import { JSONObject, JSONValue, UUID } from '@lumino/coreutils';

/** The comm target the kernels register. */
export const COMM_TARGET = 'nbrewind';

/** How long a comm request may take before the frontend gives up. */
export const REQUEST_TIMEOUT_MS = 60_000;

/** True for the kernels this extension is for: their spec names start with "nbrewind". */
export function isNBRewindKernel(name: string | null | undefined): boolean {
  return typeof name === 'string' && name.startsWith('nbrewind');
}

export type Decision = 'replayed' | 'ran' | 'not recorded';

/** `metadata.nbrewind` of an execute_reply, version 1. */
export interface IReplyInfo {
  version: number;
  decision: Decision;
  reason: string;
  duration: number | null;
  recorded_duration: number | null;
  saved: number | null;
  task_hits: number;
  task_misses: number;
  cell_run: number | null;
  recorded: boolean;
}

function isObject(value: JSONValue | undefined): value is JSONObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function numberOrNull(value: JSONValue | undefined): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function count(value: JSONValue | undefined): number {
  return typeof value === 'number' && Number.isFinite(value) ? value : 0;
}

function text(value: JSONValue | undefined): string {
  return typeof value === 'string' ? value : '';
}

/** The reply's `metadata.nbrewind`, or null when the reply has none (another kernel, a silent request). */
export function replyInfo(metadata: JSONObject): IReplyInfo | null {
  const raw = metadata['nbrewind'];
  if (!isObject(raw)) {
    return null;
  }
  const decision = raw['decision'];
  if (decision !== 'replayed' && decision !== 'ran' && decision !== 'not recorded') {
    return null;
  }
  return {
    version: count(raw['version']),
    decision,
    reason: text(raw['reason']),
    duration: numberOrNull(raw['duration']),
    recorded_duration: numberOrNull(raw['recorded_duration']),
    saved: numberOrNull(raw['saved']),
    task_hits: count(raw['task_hits']),
    task_misses: count(raw['task_misses']),
    cell_run: numberOrNull(raw['cell_run']),
    recorded: raw['recorded'] === true
  };
}

// -- the comm contract ---------------------------------------------------------

export interface IPlanCellRequest {
  cell_id: string | null;
  code: string;
}

export type PlanDecision = 'replay' | 'run' | 'depends';

export interface IPlanCell {
  index: number;
  cell_id: string | null;
  decision: PlanDecision;
  reason: string;
  cell_run: number | null;
  saves: number | null;
  after: number[];
}

export interface IPlanReply {
  reply: 'plan';
  id: string;
  version: number;
  kernel: string;
  cells: IPlanCell[];
}

export interface ILogCell {
  cell_run: number;
  execution_count: number | null;
  cell_id: string | null;
  decision: string;
  status: string;
  reason: string;
  duration: number | null;
  code: string;
}

export interface ILogSession {
  session: string;
  kernel: string;
  started: number | null;
  current: boolean;
  cells: ILogCell[];
}

export interface ILogReply {
  reply: 'log';
  id: string;
  version: number;
  sessions: ILogSession[];
}

function array(value: JSONValue | undefined): JSONValue[] {
  return Array.isArray(value) ? value : [];
}

function planCell(raw: JSONValue, position: number): IPlanCell | null {
  if (!isObject(raw)) {
    return null;
  }
  const decision = raw['decision'];
  if (decision !== 'replay' && decision !== 'run' && decision !== 'depends') {
    return null;
  }
  const index = numberOrNull(raw['index']);
  const cellId = raw['cell_id'];
  return {
    index: index === null ? position : index,
    cell_id: typeof cellId === 'string' ? cellId : null,
    decision,
    reason: text(raw['reason']),
    cell_run: numberOrNull(raw['cell_run']),
    saves: numberOrNull(raw['saves']),
    after: array(raw['after']).filter((i): i is number => typeof i === 'number')
  };
}

function logCell(raw: JSONValue): ILogCell | null {
  if (!isObject(raw)) {
    return null;
  }
  const run = numberOrNull(raw['cell_run']);
  if (run === null) {
    return null;
  }
  const cellId = raw['cell_id'];
  return {
    cell_run: run,
    execution_count: numberOrNull(raw['execution_count']),
    cell_id: typeof cellId === 'string' ? cellId : null,
    decision: text(raw['decision']),
    status: text(raw['status']),
    reason: text(raw['reason']),
    duration: numberOrNull(raw['duration']),
    code: text(raw['code'])
  };
}

function logSession(raw: JSONValue): ILogSession | null {
  if (!isObject(raw)) {
    return null;
  }
  return {
    session: text(raw['session']),
    kernel: text(raw['kernel']),
    started: numberOrNull(raw['started']),
    current: raw['current'] === true,
    cells: array(raw['cells'])
      .map(logCell)
      .filter((c): c is ILogCell => c !== null)
  };
}

/** A plan reply, checked field by field (a malformed cell is left out). */
export function parsePlan(data: JSONObject): IPlanReply {
  return {
    reply: 'plan',
    id: text(data['id']),
    version: count(data['version']),
    kernel: text(data['kernel']),
    cells: array(data['cells'])
      .map(planCell)
      .filter((c): c is IPlanCell => c !== null)
  };
}

/** A log reply, checked field by field. */
export function parseLog(data: JSONObject): ILogReply {
  return {
    reply: 'log',
    id: text(data['id']),
    version: count(data['version']),
    sessions: array(data['sessions'])
      .map(logSession)
      .filter((s): s is ILogSession => s !== null)
  };
}

/**
 * Send one request on a comm of its own and wait for the answer with the same id.
 *
 * A comm per request keeps no state across kernel restarts or changes; a kernel
 * without the `nbrewind` target closes the comm at once, which rejects.
 */
export function request(
  kernel: Kernel.IKernelConnection,
  body: JSONObject,
  timeoutMs: number = REQUEST_TIMEOUT_MS
): Promise<JSONObject> {
  const id = UUID.uuid4();
  const comm = kernel.createComm(COMM_TARGET);
  return new Promise<JSONObject>((resolve, reject) => {
    let settled = false;
    const finish = (settle: () => void): void => {
      if (settled) {
        return;
      }
      settled = true;
      window.clearTimeout(timer);
      settle();
      if (!comm.isDisposed) {
        try {
          comm.close();
        } catch {
          // The kernel went away; nothing to close.
        }
      }
    };
    const timer = window.setTimeout(
      () => finish(() => reject(new Error(`the kernel did not answer "${String(body['request'])}" in time`))),
      timeoutMs
    );
    comm.onMsg = (msg: KernelMessage.ICommMsgMsg): void => {
      const data = msg.content.data;
      if (data['id'] !== id) {
        return;
      }
      if (data['reply'] === 'error') {
        const message = typeof data['message'] === 'string' ? data['message'] : 'unknown error';
        finish(() => reject(new Error(message)));
      } else {
        finish(() => resolve(data));
      }
    };
    comm.onClose = (): void => {
      finish(() => reject(new Error('the kernel closed the nbrewind channel without answering')));
    };
    try {
      comm.open();
      comm.send({ ...body, id });
    } catch (error) {
      finish(() => reject(error instanceof Error ? error : new Error(String(error))));
    }
  });
}

export async function requestPlan(kernel: Kernel.IKernelConnection, cells: IPlanCellRequest[]): Promise<IPlanReply> {
  const payload: JSONObject = {
    request: 'plan',
    cells: cells.map((c): JSONObject => ({ cell_id: c.cell_id, code: c.code }))
  };
  const data = await request(kernel, payload);
  if (data['reply'] !== 'plan') {
    throw new Error(`unexpected answer to a plan request: ${String(data['reply'])}`);
  }
  return parsePlan(data);
}

export async function requestLog(kernel: Kernel.IKernelConnection): Promise<ILogReply> {
  const data = await request(kernel, { request: 'log' });
  if (data['reply'] !== 'log') {
    throw new Error(`unexpected answer to a log request: ${String(data['reply'])}`);
  }
  return parseLog(data);
}
