// Types of every export of the native addon. Each module adds its section here.

/** The native addon's exports. */
export interface NativeAddon {
  /** Names of the modules compiled into this build. */
  readonly modules: readonly string[];
}
