// The dashboard JSON, imported as it is, typed as Grafana's Dashboard type (strings widened:
// a JSON import has no literal types). generated/*.ts, written by gen.mjs from the same
// files, checks every enum value, every unknown key and each panel type's options.
import dashboardJson from '../dashboards/hangwatch.json';
import type { LooseDashboard } from './types';

export const dashboard: LooseDashboard = dashboardJson;
