//! What the server fuzz targets share: a model catalog whose model cannot load, so requests
//! are parsed and validated and then end at the model with an error.
use quarrel_engine::EngineHandle;
use quarrel_server::{ModelEntry, ModelLoader};

pub struct NoEngines;

impl ModelLoader for NoEngines {
    fn catalog(&self) -> Vec<ModelEntry> {
        vec![]
    }
    fn load(&self, _: &ModelEntry) -> Result<EngineHandle, String> {
        Err("no engines while fuzzing".into())
    }
}
