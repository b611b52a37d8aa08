// The shapes the dashboard is checked against: Grafana's own types from @grafana/schema, plus
// the Prometheus data source's query and annotation fields (they live in Grafana's Prometheus
// plugin, not in the dashboard schema, which leaves data-source fields open).
import type { AnnotationQuery, Dashboard, DataQuery, Panel, RowPanel } from '@grafana/schema';

// A dashboard file holds Grafana's TypeScript enum values (FieldColorModeId, VisibilityMode, ...)
// as plain strings: Literal<T> accepts exactly the enum's values, as string literals, and is
// otherwise T itself (object literals checked against it still reject unknown keys).
export type Literal<T> = T extends string
  ? `${T}`
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Literal<U>>
      : T extends object
        ? { [K in keyof T]: Literal<T[K]> }
        : T;

export interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  interval?: string;
  format?: 'time_series' | 'table' | 'heatmap';
  editorMode?: 'code' | 'builder';
  exemplar?: boolean;
}

export interface PromAnnotation extends Omit<AnnotationQuery, 'target'> {
  target?: PromQuery | { limit: number; matchAny: boolean; tags: string[]; type: string };
  titleFormat?: string;
  textFormat?: string;
  tagKeys?: string;
  useValueForTime?: boolean;
}

type StrictPanel = Omit<Literal<Panel>, 'targets'> & { targets?: Array<Literal<PromQuery>> };

export type StrictDashboard = Omit<Literal<Dashboard>, 'annotations' | 'panels'> & {
  annotations?: { list?: Array<Literal<PromAnnotation>> };
  panels?: Array<StrictPanel | Literal<RowPanel>>;
};

// Each panel type's own options and field config, as Grafana's panel plugins define them.
export type PanelShapes<Options, Custom> = { options: Literal<Options>; custom: Literal<Custom> };

// What the plain JSON import must satisfy: the same structure, every string widened (a JSON
// import loses literal types, so enum-valued fields can only be checked by the generated file).
export type Loose<T> = T extends string
  ? string
  : T extends number | boolean | null | undefined
    ? T
    : T extends Array<infer U>
      ? Array<Loose<U>>
      : T extends object
        ? { [K in keyof T]: Loose<T[K]> }
        : T;

export type LooseDashboard = Loose<StrictDashboard>;
